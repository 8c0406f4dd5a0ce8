"""Serve a trained model: `python serve.py [run_dir=...|ckpt=...|models=[...]] [port=8000]`.

A shim for a checkout: the command lives in gpt/apps/serve.py (installed as `tinygpt serve`).
"""

from gpt.apps.serve import main

if __name__ == "__main__":
    main()
