"""The command-line apps (train, sample, eval, export, prepare, sweep) and the `tinygpt`
console command, apart from the library: only these parse argv or compose Hydra configs,
all through gpt.apps.common."""
