"""Serving a trained model: an OpenAI-compatible completions API and a web playground
(`tinygpt serve`, gpt/apps/serve.py). engine.py batches the decoding, app.py speaks HTTP,
schemas.py holds the request's form, static/playground.html is the page.

Needs the `serve` extra: pip install -e '.[serve]'.
"""
