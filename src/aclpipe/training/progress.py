"""Training progress: a rich bar on a terminal, plain lines every few steps otherwise."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


class TrainProgress:
    """Shows step, loss and samples/s; ``enabled=False`` on every process but the main one."""

    def __init__(self, console: Console, log_every: int, enabled: bool = True) -> None:
        self.console, self.log_every, self.enabled = console, log_every, enabled
        self._bar: Progress | None = None
        self._task = TaskID(0)  # the bar's one task, once there is a bar
        self._samples = 0
        self._seconds = 0.0
        self._step = 0
        self._total = 0
        self._title = ""

    def start(self, title: str, total_steps: int) -> None:
        self._title, self._total, self._step = title, total_steps, 0
        self._samples, self._seconds = 0, 0.0
        if self.enabled and self.console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task(title, total=total_steps, info="")
            self._bar.start()

    def skip(self, steps: int) -> None:
        """Count steps done before a resume as done."""
        self._step += steps
        if self._bar is not None and steps:
            self._bar.update(self._task, advance=steps)

    def step(self, log: dict, samples: int, seconds: float) -> None:
        self._step += 1
        self._samples += samples
        self._seconds += seconds
        rate = self._samples / self._seconds if self._seconds else 0.0
        info = f"loss {log['loss']:.4f}  {rate:.1f} samples/s"
        if "cosine" in log and log["cosine"] == log["cosine"]:
            info += f"  cos {log['cosine']:+.2f}"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)
        elif self.enabled and (self._step % self.log_every == 0 or self._step == self._total):
            self.console.print(
                f"{self._title} step {self._step}/{self._total}  {info}", highlight=False
            )

    def epoch_done(self, stage: int, epoch: int, exits: list[int], scores: list[float]) -> None:
        if not self.enabled:
            return
        shown = "  ".join(f"L{k}:{100 * s:.1f}" for k, s in zip(exits, scores))
        self.console.print(f"stage {stage} epoch {epoch} dev score  {shown}", highlight=False)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
