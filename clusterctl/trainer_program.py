"""The bundled trainer (clusterctl.train) as a kind of program `run` knows (program.Capabilities): what it reads,
how it resumes, what it produces and what it checks before a launch, by its contract (trainer_contract.py).

    kind = BundledTrainer(prelaunch=check, strategy_shrink=refusal)   # cli/launch.py gives train/'s
    kind.inputs(["--model", "models/m", "--data", "d"], run_gives_data=False)   # [("--model", ...), ("--data", "d")]
    kind.with_data(args, "/w/data")           # ["--data", "/w/data", *args]: a user's own later --data still wins
    kind.describe(["--model", "m"])           # {"kind": "fine-tune", "model": "m", "strategy": "dp"}

Its checks that need the trainer's own code (the memory plan, a --model mlx-lm can build) stay in train/prelaunch.py,
reached through the CLI, which hands them over as `prelaunch`, and which strategy cannot continue on fewer ranks in
train/strategies.py, handed over as `strategy_shrink`: run never imports train/. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .program import Capabilities, PlannedLaunch, Product
from .trainer_contract import (ADAPTER_CONFIG, DATA, DEFAULT_STRATEGY, MODEL, OUT, RESUME, STRATEGY, TRAINER_KINDS,
                               TRAINER_MODULE, add_run_flag, flag_value, replace_flag, setting)


@dataclass(frozen=True)
class BundledTrainer(Capabilities):
    """`python -m clusterctl.train`: reads no stdin; reads --model (and its own --data when run gives none) from
    directories run copies with the project when they are in it; continues a restart from its newest checkpoint;
    pictures its loss; a strategy whose checkpoints are sharded over the ranks cannot shrink onto fewer (fsdp);
    `--resume latest` under run is the newest run here with a checkpoint."""

    # its checks before a launch (train/prelaunch.check_before_launch, given by the CLI); None: none
    prelaunch: Callable[[PlannedLaunch], object] | None = None
    # why a run of --strategy NAME (None: the default) cannot shrink under --elastic, or None
    # (train/strategies.shrink_refusal, given by the CLI: the strategies are the trainer's registry)
    strategy_shrink: Callable[[str | None], str | None] | None = None
    # a settings file's values by the trainer's names (train/config.file_settings, given by the CLI: a -c FILE,
    # ours or mlx-lm's, may name the model and the data); None: only flags are read here
    settings_file: Callable[[str], dict] | None = None

    module = TRAINER_MODULE
    reads_stdin = False
    resumes_from_checkpoints = True
    pictures_loss = True

    @property
    def checks_before_launch(self) -> bool:
        return self.prelaunch is not None

    def _setting(self, args: Sequence[str], flag: str) -> str | None:
        return setting(args, flag, flag.lstrip("-").replace("-", "_"), self.settings_file)

    def store_model(self, args: Sequence[str]) -> str | None:
        return self._setting(args, MODEL)

    def with_store_model(self, args: Sequence[str], model: str) -> list[str]:
        if flag_value(args, MODEL) is None:        # named by the settings file: a flag, which wins over it
            return add_run_flag(list(args), MODEL, model)
        return replace_flag(args, MODEL, model)

    def inputs(self, args: Sequence[str], run_gives_data: bool) -> list[tuple[str, str]]:
        data = self._setting(args, DATA)
        return [] if run_gives_data or not data else [(DATA, data)]

    def with_data(self, args: Sequence[str], data_dir: str) -> list[str]:
        return add_run_flag(list(args), DATA, data_dir)

    def asks_latest(self, args: Sequence[str]) -> bool:
        return flag_value(args, RESUME) == "latest" and not flag_value(args, OUT)

    def resuming_from(self, args: Sequence[str], run_dir: str) -> list[str]:
        return replace_flag(args, RESUME, run_dir)

    def shrink_refusal(self, args: Sequence[str]) -> str | None:
        return self.strategy_shrink(flag_value(args, STRATEGY)) if self.strategy_shrink is not None else None

    def check(self, planned: PlannedLaunch) -> None:
        if self.prelaunch is not None:
            self.prelaunch(planned)

    def products(self, args: Sequence[str]) -> tuple[Product, ...]:
        """A training run's export (<run>/model: train/trainer.py, after fine-tuning a --model), or an --adapter
        run's adapters (<run>/adapters: train/adapters.py publish); a run writes one of them, or neither."""
        return (Product("model", "model", "config.json"), Product("adapters", "adapters", ADAPTER_CONFIG))

    def describe(self, args: Sequence[str]) -> dict:
        """Its kind is the one TRAINER_KINDS gives its flags, else "train", of its --model, with its --strategy
        (the trainer's default when not given: its own choice, "auto" or a --config file's, replaces it in
        summary.json once it has said)."""
        kind = next((kind for flag, kind in TRAINER_KINDS if self._setting(args, flag) is not None), "train")
        if kind == "fine-tune" and flag_value(args, "--fine-tune-type") in ("lora", "dora"):      # mlx-lm's name
            kind = next(kind for flag, kind in TRAINER_KINDS if flag == "--adapter")
        return {"kind": kind, "model": self._setting(args, MODEL),
                "strategy": self._setting(args, STRATEGY) or DEFAULT_STRATEGY}
