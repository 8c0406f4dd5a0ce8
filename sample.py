"""Sample text from a trained GPT: `python sample.py [run_dir=...|ckpt=...] [prompt=...]`.

A shim for a checkout: the command lives in gpt/apps/sample.py (installed as `tinygpt sample`).
"""

from gpt.apps.sample import main

if __name__ == "__main__":
    main()
