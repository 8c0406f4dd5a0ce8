"""Train a GPT: `python train.py [key=value ...]`, or a sweep with `python train.py -m ...`.

All the work happens in gpt.trainer; this file only turns the Hydra config into a plain dict.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gpt.cli import check_keys, guard, preflight, quiet_non_zero_ranks


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from gpt.trainer import train  # imported here so `--help` and config errors stay fast

    overrides = list(HydraConfig.get().overrides.task)
    return guard(lambda: train(OmegaConf.to_container(cfg, resolve=True), overrides=overrides))


if __name__ == "__main__":
    preflight(sys.argv[1:], Path(__file__).resolve().parent / "configs")
    check_keys(sys.argv[1:], Path(__file__).resolve().parent / "configs", "config")
    sys.argv[1:] = quiet_non_zero_ranks(sys.argv[1:])
    main()
