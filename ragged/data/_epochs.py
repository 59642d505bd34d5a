"""The epoch machinery the batch samplers share: one global plan per epoch, dealt to the ranks
in steps of batches of about equal cost, with a state that resumes an epoch at its next batch
(``EpochSampler``), and the argument checks of the samplers and the planner."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import Sampler

from .._errors import Func, name_of, type_error, typename, value_error

Cost = Callable[[list[int]], float]


def host_lengths(func: Func, lengths: object) -> list[int]:
    """Per-sample lengths as a host list of non-negative ints (a tensor is read once)."""
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise type_error(
                func,
                "lengths",
                "must be a 1-D integer tensor or a sequence of ints",
                typename(lengths),
            )
        host = lengths.tolist()
    elif isinstance(lengths, (Sequence, range)) and not isinstance(lengths, (str, bytes)):
        host = list(lengths)
    else:
        raise type_error(
            func, "lengths", "must be a 1-D integer tensor or a sequence of ints", typename(lengths)
        )
    for i, n in enumerate(host):
        if isinstance(n, bool) or not isinstance(n, int):
            raise type_error(func, "lengths", "must contain only ints", f"lengths[{i}] = {n!r}")
        if n < 0:
            raise value_error(func, "lengths", "must be non-negative", f"lengths[{i}] = {n}")
    return host


def positive_int(func: Func, param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(func, param, "must be an int", typename(value))
    if value <= 0:
        raise value_error(func, param, "must be positive", value)
    return value


def _seeded(generator: torch.Generator | None) -> torch.Generator:
    if generator is not None:
        return generator
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return torch.Generator().manual_seed(seed)


def _replicas(func: Func, num_replicas: object, rank: object) -> tuple[int, int]:
    """``(num_replicas, rank)``, each defaulting to the initialised process group's."""
    grouped = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if grouped else 1
    count = positive_int(func, "num_replicas", num_replicas)
    if rank is None:
        rank = dist.get_rank() if grouped else 0
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < count:
        raise value_error(func, "rank", f"must be an int in [0, {count})", repr(rank))
    return count, rank


def _tokens(lengths: list[int]) -> float:
    return float(sum(lengths))


class EpochSampler(Sampler[list[int]]):
    """Epochs, ranks and resumption, shared by the batch samplers.

    A subclass implements ``_batches(generator)``: the epoch's batches for all ranks.
    """

    def __init__(
        self,
        func: Func,
        lengths: Sequence[int] | Tensor,
        *,
        shuffle: bool,
        drop_last: bool,
        generator: torch.Generator | None,
        seed: int | None,
        num_replicas: int | None,
        rank: int | None,
        cost: Cost | None,
    ) -> None:
        self.lengths = host_lengths(func, lengths)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_replicas, self.rank = _replicas(func, num_replicas, rank)
        if seed is not None:
            if generator is not None:
                raise TypeError(f"{name_of(func)}: pass at most one of `seed` and `generator`.")
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise type_error(func, "seed", "must be an int or None", typename(seed))
        elif generator is None and self.num_replicas > 1:
            seed = 0  # ranks must agree on the epoch's batches (as DistributedSampler)
        self.seed = seed
        self.generator = generator
        if cost is not None and not callable(cost):
            raise type_error(
                func, "cost", "must be a callable on a list of lengths", typename(cost)
            )
        self.cost: Cost = _tokens if cost is None else cost
        self.epoch = 0
        self._planned: tuple[Tensor | None, list[list[int]]] | None = None
        self._start: Tensor | None = None  # a loaded epoch's generator state at its start
        self._done = 0  # batches of the current epoch handed out
        self._resume = False

    def _batches(self, generator: torch.Generator | None) -> list[list[int]]:
        raise NotImplementedError

    # --- epochs -------------------------------------------------------------------------------

    def _epoch_generator(self) -> tuple[torch.Generator | None, Tensor | None]:
        """The generator that plans this epoch and its state at the start (to resume)."""
        if not self.shuffle:
            return None, None
        if self.seed is not None:
            return torch.Generator().manual_seed(self.seed + self.epoch), None
        if self._resume and self._start is not None:
            generator = self.generator if self.generator is not None else torch.Generator()
            generator.set_state(self._start)
            return generator, self._start
        generator = _seeded(self.generator)
        return generator, generator.get_state()

    def _plan(self) -> list[list[int]]:
        """This rank's batches of the current epoch (planned once; ``len()`` plans ahead)."""
        if self._planned is None:
            generator, start = self._epoch_generator()
            self._planned = (start, self._deal(self._batches(generator), generator))
        return self._planned[1]

    def _deal(self, batches: list[list[int]], generator: torch.Generator | None) -> list[list[int]]:
        """This rank's batches: one of every step of ``num_replicas`` batches of similar cost."""
        world = self.num_replicas
        if world == 1:
            return batches
        costs = [self.cost([self.lengths[i] for i in b]) for b in batches]
        order = sorted(range(len(batches)), key=lambda i: -costs[i])  # stable
        steps = [order[i : i + world] for i in range(0, len(order), world)]
        if steps and len(steps[-1]) < world:
            if self.drop_last:
                steps.pop()
            else:  # pad the cheapest step with its own batches
                last = steps[-1]
                steps[-1] = [last[i % len(last)] for i in range(world)]
        if generator is not None:
            steps = [steps[i] for i in torch.randperm(len(steps), generator=generator)]
        # Rotate within steps so that no rank always gets the dearest batch of a step.
        return [batches[step[(self.rank + s) % world]] for s, step in enumerate(steps)]

    def __len__(self) -> int:
        return len(self._plan())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._plan()
        skip = self._done if self._resume else 0
        self._done, self._resume = skip, False
        for batch in batches[skip:]:
            self._done += 1
            yield batch
        self.epoch += 1
        self._planned, self._start, self._done = None, None, 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch to plan next (as ``DistributedSampler.set_epoch``).

        With ``seed``, epoch ``e`` is shuffled by ``seed + e``; the epoch also advances by one
        after every complete pass, so calling this is optional. Setting another epoch than the
        one a loaded state was in discards the resumption point.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise value_error(
                f"ragged.data.{type(self).__name__}.set_epoch",
                "epoch",
                "must be a non-negative int",
                repr(epoch),
            )
        if epoch != self.epoch:
            self.epoch = epoch
            self._planned, self._start, self._done, self._resume = None, None, 0, False

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: the epoch, the batches of it already handed out, and the
        state of the generator that plans it; and what it was made for (its class, a
        fingerprint of its lengths, the number of replicas), which ``load_state_dict`` checks.
        The same on every rank.

        With a ``DataLoader`` that prefetches (worker processes), the sampler runs ahead of
        training: set ``state["batches"]`` to the number of batches actually trained on.
        """
        start = None
        if self._planned is not None:  # planned (by len() or iter()): its starting state
            start = self._planned[0]
        elif self._resume:  # loaded and not yet planned
            start = self._start
        elif self.shuffle and self.seed is None and self.generator is not None:
            start = self.generator.get_state()  # the next epoch starts from here
        return {
            "sampler": type(self).__name__,
            "lengths": lengths_fingerprint(self.lengths),
            "num_replicas": self.num_replicas,
            "epoch": self.epoch,
            "batches": self._done,
            "generator_state": None if start is None else start.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` continues the saved epoch at its next batch, and later
        epochs follow as they would have.

        The state must come from ``state_dict`` of a sampler of this class, over the same
        lengths and number of replicas; every field is checked (a ``ValueError`` or
        ``TypeError`` naming it), and a refused state leaves the sampler as it was.
        """
        func = f"ragged.data.{type(self).__name__}.load_state_dict"
        fields = ("sampler", "lengths", "num_replicas", "epoch", "batches", "generator_state")
        if not isinstance(state, dict):
            raise type_error(func, "state", "must be a dict from state_dict()", typename(state))
        if set(state) != set(fields):
            expected = f"must have the keys {list(fields)} (a state_dict() of this sampler)"
            raise value_error(func, "state", expected, f"keys {sorted(map(str, state))}")
        own = {
            "sampler": type(self).__name__,
            "lengths": lengths_fingerprint(self.lengths),
            "num_replicas": self.num_replicas,
        }
        for key, value in own.items():
            if state[key] != value:
                expected = f"must be saved by a sampler of the same {key} ({value!r})"
                raise value_error(func, f"state['{key}']", expected, repr(state[key]))
        for key in ("epoch", "batches"):
            n = state[key]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                expected = "must be a non-negative int"
                raise type_error(func, f"state['{key}']", expected, repr(n))
        start = state["generator_state"]
        if start is not None and (
            not isinstance(start, Tensor) or start.dtype != torch.uint8 or start.dim() != 1
        ):
            expected = "must be None or a generator state (a 1-D uint8 tensor)"
            raise type_error(func, "state['generator_state']", expected, typename(start))
        before = (self.epoch, self._done, self._start, self._planned, self._resume)
        self.epoch, self._done = state["epoch"], state["batches"]
        self._start = None if start is None else start.clone()
        self._planned, self._resume = None, True
        try:
            count = len(self._plan())
        except Exception:
            self.epoch, self._done, self._start, self._planned, self._resume = before
            raise
        if state["batches"] > count:
            self.epoch, self._done, self._start, self._planned, self._resume = before
            expected = f"must be at most the batches of its epoch ({count})"
            raise value_error(func, "state['batches']", expected, state["batches"])


def lengths_fingerprint(lengths: Sequence[int]) -> tuple[int, int, int]:
    """``(count, total, crc32)`` of a sampler's lengths: a state is loaded for the same data.

    >>> lengths_fingerprint([3, 1, 2])
    (3, 6, 395507172)
    """
    data = torch.tensor(list(lengths), dtype=torch.int64).numpy().tobytes()
    return len(lengths), int(sum(lengths)), zlib.crc32(data)
