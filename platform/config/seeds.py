"""Every random stream of a trial, derived from ``trial.seed`` (the one home of the formulas).
"""

from __future__ import annotations

from typing import ClassVar

from distillab.config.base import _Strict
from distillab.config.tasks import sft_stream_offset, task_entry


class SeedsConfig(_Strict):
    """How every random stream of a trial derives from ``trial.seed`` (s), the worker's
    rank (r) and the step (t), so that no two streams share a seed: each stream is a
    method here (the one home of the formulas; no offset is written anywhere else). The
    defaults are the values every recorded run used: change one and the numbers it feeds
    change. The test splits are seeded by ``tasks.test_seed`` alone, the same for every
    trial (`test_split_seed`), and a prepared micro model's SFT data by the prepare seed
    (`sft_seed`); their offsets belong to the tasks (`config.tasks.TaskEntry`:
    ``test_split_offset``, ``sft_streams``), not to the trial's config (its id and cache keys)."""

    #: a micro model's SFT data from its prepare seed p: p · SFT_STREAMS + i for the i-th Countdown task of
    #: ``countdown_examples`` (sorted by name), p · SFT_STREAMS + the offset of a task's named stream (`sft_seed`)
    SFT_STREAMS: ClassVar[int] = 1000

    #: training problems of the distillation domain (Countdown-3, or multiple-choice items): seed s + train_problems
    train_problems: int = 7919
    #: per-rank shuffle of the training prompts: s · shuffle + r (RLVR: s · shuffle + rlvr_shuffle + r)
    shuffle: int = 1000
    #: rollout sampling at distillation step t on rank r: s · rollout + t · rollout_step + r
    rollout: int = 100003
    #: the step multiplier of the rollout seed (see ``rollout``)
    rollout_step: int = 97
    #: token draws of the sampled estimator on rank r: s · loss + r
    loss: int = 7
    #: RLVR training problems: s + rlvr_problems, shuffled with s · shuffle + rlvr_shuffle + r
    rlvr_problems: int = 104729
    #: offset of RLVR's per-rank shuffle (see ``shuffle``)
    rlvr_shuffle: int = 17
    #: RLVR sampling at RLVR step t on rank r (σ = s + r): σ · rlvr_sampling + t · rlvr_step
    rlvr_sampling: int = 7919
    #: the step multiplier of the RLVR sampling seed (see ``rlvr_sampling``)
    rlvr_step: int = 31
    #: evaluation with stage seed s: Countdown task i of evaluation.countdown_tasks samples with
    #: s + eval_task · i (its pass@k samples + eval_pass), the multiple-choice and the math task with
    #: s + eval_mcq (+ eval_pass), micro OOD task j with s + eval_ood · j + eval_ood_offset; requests at
    #: equal sampling settings are sampled in one call seeded with the first one's seed
    #: (`evals.sampling.sample_batched`)
    eval_task: int = 101
    #: offset of a Countdown task's pass@k samples (see ``eval_task``)
    eval_pass: int = 1
    #: offset of the multiple-choice and math evaluations (see ``eval_task``)
    eval_mcq: int = 404
    #: multiplier of the micro OOD task index (see ``eval_task``)
    eval_ood: int = 7
    #: offset of the micro OOD tasks (see ``eval_task``)
    eval_ood_offset: int = 3

    def rollout_seed(self, seed: int, step: int, rank: int) -> int:
        """Sampling seed of distillation step ``step`` (0-based) on ``rank``: s · rollout + t · rollout_step + r."""
        return seed * self.rollout + step * self.rollout_step + rank

    def train_problems_seed(self, seed: int) -> int:
        """The distillation domain's training problems (Countdown-3, multiple-choice or math items):
        s + train_problems."""
        return seed + self.train_problems

    def shuffle_seed(self, seed: int, rank: int) -> int:
        """Rank ``rank``'s order of its training prompts: s · shuffle + r."""
        return seed * self.shuffle + rank

    def loss_seed(self, seed: int, rank: int) -> int:
        """The token draws of the sampled estimator (and every other draw of the loss) on ``rank``: s · loss + r."""
        return seed * self.loss + rank

    def rlvr_problems_seed(self, seed: int) -> int:
        """The RLVR stage's training problems: s + rlvr_problems."""
        return seed + self.rlvr_problems

    def rlvr_shuffle_seed(self, seed: int) -> int:
        """Their order (one for every rank, which takes every world-th): s · shuffle + rlvr_shuffle."""
        return seed * self.shuffle + self.rlvr_shuffle

    @staticmethod
    def rlvr_seed(seed: int, rank: int) -> int:
        """The RLVR seed σ of ``rank`` (what `rlvr.run_rlvr` takes): s + r."""
        return seed + rank

    def rlvr_sampling_seed(self, sigma: int, step: int) -> int:
        """RLVR sampling at RLVR step ``step`` (0-based) with seed σ (`rlvr_seed`):
        σ · rlvr_sampling + t · rlvr_step."""
        return sigma * self.rlvr_sampling + step * self.rlvr_step

    def eval_task_seed(self, seed: int, task: str, index: int) -> int:
        """The accuracy samples of an evaluation task at stage seed ``seed``: a Countdown task (one whose
        entry has ``eval_seed_by_index``), ``index`` of ``evaluation.countdown_tasks``, s + eval_task · i;
        every other task (``mcq``, ``math``, ...; ``index`` unused) s + eval_mcq.

        Raises:
            KeyError: no such task."""
        return seed + (self.eval_task * index if task_entry(task).eval_seed_by_index else self.eval_mcq)

    def eval_pass_seed(self, task_seed: int) -> int:
        """The pass@k samples of a task whose accuracy samples use ``task_seed`` (`eval_task_seed`): + eval_pass."""
        return task_seed + self.eval_pass

    def eval_ood_seed(self, seed: int, index: int) -> int:
        """Micro OOD task ``index`` at stage seed ``seed``: s + eval_ood · j + eval_ood_offset."""
        return seed + self.eval_ood * index + self.eval_ood_offset

    @staticmethod
    def test_split_seed(test_seed: int, task: str) -> int:
        """The fixed test split of ``task``: ``tasks.test_seed`` + its entry's ``test_split_offset``
        (Countdown-3 0, Countdown-4E 1, Countdown-2 and Countdown-4 7, ``mcq`` 11, ``math`` 13).

        Raises:
            KeyError: no such task; ValueError: a task without a seeded test split."""
        offset = task_entry(task).test_split_offset
        if offset is None:
            raise ValueError(f"task {task!r} has no seeded test split (its entry's test_split_offset is None)")
        return test_seed + offset

    @staticmethod
    def prepare_seed(prepare_seed: int, role: str) -> int:
        """The seed of preparing the micro ``role`` (``teacher`` or ``student``) from ``models.prepare_seed`` p:
        p for the teacher, p + 1 for the student (its weights' init, its SFT data: `sft_seed`)."""
        return prepare_seed + (0 if role == "teacher" else 1)

    @classmethod
    def sft_seed(cls, prepare_seed: int, stream: int | str) -> int:
        """A prepared micro model's SFT data: the ``stream``-th Countdown task (an int) or the named stream
        ``stream`` of a task (``styled`` 29, ``mcq`` 23, ``skills`` 17, ``math`` 31: the tasks' entries'
        ``sft_streams``) from its prepare seed p: p · SFT_STREAMS + i (+ the offset).

        Raises:
            KeyError: a name no task declares."""
        offset = stream if isinstance(stream, int) else sft_stream_offset(stream)
        return prepare_seed * cls.SFT_STREAMS + offset
