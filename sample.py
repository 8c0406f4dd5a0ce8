"""Sample text from a trained GPT: `python sample.py [run_dir=...|ckpt=...] [prompt=...]`.

By default it uses the best checkpoint of the most recent run under outputs/.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gpt.cli import check_keys, guard, preflight, take_verbatim

PROMPT = None  # set from the command line below


@hydra.main(version_base="1.3", config_path="configs", config_name="sample")
def main(cfg: DictConfig) -> None:
    from gpt.config import sample_settings
    from gpt.sampling import sample

    plain = OmegaConf.to_container(cfg, resolve=True)
    if PROMPT is not None:
        plain["prompt"] = PROMPT
    guard(lambda: sample(plain, sample_settings(plain)))


if __name__ == "__main__":
    # The prompt is free text, taken as typed rather than parsed as a Hydra override.
    sys.argv[1:], PROMPT = take_verbatim(sys.argv[1:], "prompt")
    preflight(sys.argv[1:], Path(__file__).resolve().parent / "configs")
    check_keys(sys.argv[1:], Path(__file__).resolve().parent / "configs", "sample")
    main()
