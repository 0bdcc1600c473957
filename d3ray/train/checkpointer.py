"""The training loop's checkpoints: when the trainers save, what goes in, and what it costs them.

At every chunk boundary (and at the end of the run) the loop hands the checkpointer two calls:

    chunk_ended(state, ...)     before the scheduler's work on the ranks (feedback, snapshot, scores):
                                is a checkpoint due? (``checkpoint_due``: every K chunks, or at the chunk
                                crossing each multiple of ``checkpoint_every_steps``, or ``checkpoint_every_sec``
                                after the last, rank 0's clock broadcast; always at the end). If so, rank 0
                                asks the coordinator for its ``checkpoint_state(next_chunk)`` now, while the
                                coordinator waits for the trainers' scores and has time to answer
    save_if_due(state, ...)     after it: rank 0 waits for the next chunk's decision (its wait is the next
                                chunk's, ``time/wait_sec``), collects the coordinator's state (asked again
                                if the next chunk was decided after the early answer), then every rank saves
                                (d3ray/train/checkpoint.py ``save_checkpoint``, the trainer side's state) and
                                reports the checkpoint to Ray Train; rank 0 logs ``time/checkpoint_sec`` (the
                                state collected and the save; with ``checkpoint_upload: async`` not the upload)
                                and its parts, ``time/checkpoint_{state,save,report}_sec`` (the report waits
                                for every rank: a rank that arrives late shows there)
                                and lets the coordinator release the chunks the checkpoint covers

Where the ranks save (``train.checkpoint_upload``): ``direct`` (``auto`` on a filesystem ``storage_path``) into
the checkpoint's own directory under the run's storage, named by rank 0 and shared with the others, and
reported as already there (Ray Train's ``NO_UPLOAD``): nothing is copied, and no upload thread takes the
cores of the chunk after; ``async`` / ``sync`` into a temporary directory that Ray Train copies to storage
(in a thread while the next chunk trains, or before it) and then deletes.

The coordinator's answer is the same whenever it is asked between the chunk's last step and the save: the
decisions already served from ``next_chunk`` on (the trainers asked for ``next_chunk`` at the start of this
chunk; the one after is only asked for once they train ``next_chunk``), the data cursor of ``next_chunk``,
and for a scheduler that reads feedback its state once it has observed every trained chunk (the coordinator
waits for rank 0's feedback, sent in the boundary's work). Asked before the boundary's work, it is not
asked of a coordinator busy with the decision the scores just started and the next chunk's read.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.train.checkpoint import TrainState, checkpoint_due, load_checkpoint, save_checkpoint
from d3ray.train.config import TrainConfig
from d3ray.train.metrics import RunLogs
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)

__all__ = ["Checkpointer", "resume"]


def resume(trainer: TrainerRank, tcfg: TrainConfig, coordinator: Any, trainer_side: Any,
           base_model: str | None) -> TrainState:
    """Where this run starts: Ray Train's newest checkpoint (a resumed run), else ``train.init_checkpoint``
    (a branch of a shared trunk, d3ray compare), else the start. Every rank loads the engine, its RNG and
    its trainer-side state; rank 0 hands the checkpoint's schedule state to the coordinator."""
    import ray
    import ray.train

    state = TrainState()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and tcfg.init_checkpoint:
        checkpoint = ray.train.Checkpoint.from_directory(tcfg.init_checkpoint)
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(trainer.engine, Path(d), trainer.rank, base_model=base_model)
            trainer_side.restore(Path(d))
        logger.info("rank %d resumed at step %d, chunk %d+%d", trainer.rank, state.step, state.next_chunk,
                    state.position)
    if trainer.is_rank0 and state.schedule:
        ray.get(coordinator.restore.remote(state.schedule))
    return state


def upload_in_place(upload: str, storage_filesystem: Any) -> bool:
    """Whether the ranks save straight into storage (``train.checkpoint_upload``: ``direct``, or ``auto`` on
    a local filesystem, which is also what an NFS mount is to pyarrow)."""
    import pyarrow.fs

    local = isinstance(storage_filesystem, pyarrow.fs.LocalFileSystem)
    if upload == "direct" and not local:  # preflight refuses it for a URI storage_path first
        raise ValueError(f"train.checkpoint_upload=direct needs a filesystem storage_path, not {storage_filesystem.type_name}")
    return upload == "direct" or (upload == "auto" and local)


class Checkpointer:
    """Owns the checkpoint cadence and the save (see the module docstring); every rank calls the same methods.

    Args:
        trainer: this rank.
        tcfg: the train config (``checkpoint_every_chunks``, ``_steps``, ``_sec``, ``checkpoint_upload``).
        coordinator: the ScheduleCoordinator actor.
        trainer_side: the rank's :class:`~d3ray.train.scheduling.trainer_side.TrainerSide` (its state goes in too).
        tokenizer_dir: the run's tokenizer (copied into every checkpoint).
        base_model: the frozen LoRA base's directory (left out of the checkpoint), or None.
        device: the device of this rank's collectives (the every-seconds decision is broadcast).
        logs: rank 0's run-directory logs, or None.
        step: the step training starts at (the steps cadence counts from the last checkpoint).
    """

    def __init__(self, trainer: TrainerRank, tcfg: TrainConfig, coordinator: Any, trainer_side: Any,
                 tokenizer_dir: str, base_model: str | None, device: Any, logs: RunLogs | None, step: int) -> None:
        import ray.train

        self.trainer, self.tcfg, self.coordinator, self.trainer_side = trainer, tcfg, coordinator, trainer_side
        self.tokenizer_dir, self.base_model, self.device, self.logs = tokenizer_dir, base_model, device, logs
        self.storage = ray.train.get_context().get_storage()
        self.direct = upload_in_place(tcfg.checkpoint_upload, self.storage.storage_filesystem)
        mode = "no_upload" if self.direct else ("async" if tcfg.checkpoint_upload == "auto" else tcfg.checkpoint_upload)
        self.upload = ray.train.CheckpointUploadMode[mode.upper()]
        self.last_time, self.last_step = time.perf_counter(), step
        self.due = False
        self.finished = False
        self.state_ref: Any = None
        self.carried_wait = 0.0
        """A checkpoint's wait for the next decision: the next chunk's wait (taken by :meth:`take_carried_wait`)."""

    def chunk_ended(self, state: TrainState, chunk_done: bool, finished: bool) -> None:
        """Decide whether a checkpoint is due at this cursor (``state.next_chunk`` already the next chunk
        when ``chunk_done``), and if so have rank 0 ask the coordinator for its state now."""
        tcfg = self.tcfg
        due = checkpoint_due(finished=finished, chunk_done=chunk_done, next_chunk=state.next_chunk,
                             every_chunks=tcfg.checkpoint_every_chunks,
                             seconds_since_last=time.perf_counter() - self.last_time,
                             every_sec=tcfg.checkpoint_every_sec, every_steps=tcfg.checkpoint_every_steps,
                             step=state.step, last_checkpoint_step=self.last_step)
        if self.trainer.world > 1 and tcfg.checkpoint_every_sec > 0 and chunk_done and not finished:
            # The clocks of the ranks differ: rank 0's decision holds for all (save is a collective).
            import torch
            import torch.distributed as dist

            flag = torch.tensor([float(due)], device=self.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        self.due, self.finished = due, finished
        if due and self.trainer.is_rank0:
            self.state_ref = self.coordinator.checkpoint_state.remote(state.next_chunk)

    def take_carried_wait(self) -> float:
        """The seconds the last checkpoint waited for the next chunk's decision (then 0: counted once)."""
        wait, self.carried_wait = self.carried_wait, 0.0
        return wait

    def save_if_due(self, state: TrainState, next_ref: Any, metrics: dict[str, Any],
                    last_eval: dict[str, float]) -> None:
        """Save a checkpoint if :meth:`chunk_ended` found one due (a collective: every rank saves its part).

        Args:
            state: the training state (its ``schedule`` is set to the coordinator's here).
            next_ref: the trainers' pending request for the next chunk (its decision belongs in the checkpoint).
            metrics: what the report carries (step, loss, tokens, chunk id); ``last_eval``'s finite values join them.
        """
        import ray
        import ray.train

        if not self.due:
            return
        self.due = False
        self.last_time, self.last_step = time.perf_counter(), state.step
        rank0 = self.trainer.is_rank0
        if rank0 and not self.finished:  # the next chunk's decision belongs in this checkpoint
            t_wait = time.perf_counter()
            ray.get(next_ref)
            self.carried_wait = time.perf_counter() - t_wait
        start = time.perf_counter()
        if rank0:
            state.schedule = self._coordinator_state(state.next_chunk)
        collected = time.perf_counter()
        # every rank at the save together (rank 0's wait for the others is its own part), with its directory
        name = self._shared_name()
        arrived = time.perf_counter()
        report = {**metrics, **{k: v for k, v in last_eval.items() if np.isfinite(v)}}
        if self.direct:
            directory = Path(self.storage.build_checkpoint_path_from_name(name))
            directory.mkdir(parents=True, exist_ok=True)
        else:  # Ray Train removes the local copy once it is in storage_path (async: while the next chunk trains)
            directory = Path(tempfile.mkdtemp(prefix="d3ray-checkpoint-"))
        save_checkpoint(self.trainer.engine, state, directory, self.trainer.rank, Path(self.tokenizer_dir),
                        base_model=self.base_model)
        self.trainer_side.save(directory)
        saved = time.perf_counter()
        if self.direct:
            checkpoint = ray.train.Checkpoint(str(directory), filesystem=self.storage.storage_filesystem)
        else:
            checkpoint = ray.train.Checkpoint.from_directory(str(directory))
        ray.train.report(report, checkpoint=checkpoint, checkpoint_dir_name=name, checkpoint_upload_mode=self.upload,
                         delete_local_checkpoint_after_upload=not self.direct)
        if rank0:  # what the checkpoint cost the trainers (with async: the save, not the upload), and its parts
            end = time.perf_counter()
            self.logs.log_metrics({"step": state.step, "time/checkpoint_sec": end - start,
                                   "time/checkpoint_state_sec": collected - start,
                                   "time/checkpoint_arrival_sec": arrived - collected,
                                   "time/checkpoint_save_sec": saved - arrived,
                                   "time/checkpoint_report_sec": end - saved})
            self.coordinator.release.remote(state.next_chunk)

    def _shared_name(self) -> str:
        """The checkpoint's directory name (Ray Train's ``checkpoint_<timestamp>``), rank 0's for every rank
        (with several ranks a collective: each waits there for the others)."""
        name = [self.storage.make_default_checkpoint_dir_name()]
        if self.trainer.world > 1:
            import torch.distributed as dist

            dist.broadcast_object_list(name, src=0, device=self.device)
        return name[0]

    def _coordinator_state(self, next_chunk: int) -> dict[str, Any]:
        """The coordinator's ``checkpoint_state(next_chunk)``: the early answer, or (when the next chunk was
        decided after it, and the run goes on to train it) the answer to a second ask."""
        import ray

        schedule = ray.get(self.state_ref)
        self.state_ref = None
        if not self.finished and str(next_chunk) not in schedule.get("decisions", {}):
            schedule = ray.get(self.coordinator.checkpoint_state.remote(next_chunk))
        return schedule
