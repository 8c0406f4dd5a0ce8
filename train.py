"""Train a GPT: `python train.py [key=value ...]`, or a sweep with `python train.py -m ...`.

A shim for a checkout: the command lives in gpt/apps/train.py (installed as `tinygpt train`).
"""

from gpt.apps.train import main

if __name__ == "__main__":
    main()
