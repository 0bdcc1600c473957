"""In-memory stand-ins for interfaces of d3ray (never for its own logic): a sequence source
(``d3ray.data.source.SequenceSource``, whose readers can be shared like ``CorpusSource``'s) over a list,
for pure tests of the chunk stream; the coordinator's ``sketch_request`` for the trainers' batch fetch."""

import copy
import threading
from dataclasses import dataclass

import numpy as np

from d3ray.data.ledger import BadRecordLedger


@dataclass(frozen=True)
class Seq:
    tokens: np.ndarray
    domain: str
    sample_id: str
    n_tokens: int
    loss_mask: np.ndarray | None = None


class ListGroup:
    """A reader group (``d3ray.data.source.ReaderGroup``) of one sequence: the one at ``index``."""

    def __init__(self, seqs, index):
        self.seqs, self.index = seqs, index

    def state(self, domain=None, skip=0):
        before = self.index if domain is None else sum(s.domain == domain for s in self.seqs[: self.index])
        return {"i": before + skip}


class ListReader:
    """One epoch of an in-memory lane; its state is the index of the next sequence, each sequence is a
    group of its own."""

    def __init__(self, seqs, state):
        self.seqs, self.i = seqs, state["i"] if state else 0
        self.start = self.i
        self.near_end = False
        self.reads = 0
        self.records_read = 0
        self.group = ListGroup(seqs, self.i)

    def prestart(self):
        pass

    def close(self):
        pass

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.seqs):
            raise StopIteration
        self.group = ListGroup(self.seqs, self.i)
        self.i += 1
        self.reads += 1
        return self.seqs[self.i - 1]

    def state(self):
        return {"i": self.i}


class ListSource:
    """The source protocol (d3ray.data.source.SequenceSource) over in-memory sequences."""

    shares_readers = True

    def __init__(self, seqs, domains=("d",), shared_span_blocks=0):
        self.seqs, self.domains, self.readers = seqs, list(domains), []
        self.shared_span_blocks = shared_span_blocks  # mixed streams: see d3ray.data.domain_lanes
        self.ledger = BadRecordLedger()

    def with_ledger(self, ledger):
        source = copy.copy(self)  # the same list of opened readers
        source.ledger = ledger
        return source

    def reader(self, epoch, lane, state):
        reader = ListReader([s for s in self.seqs if lane in (None, s.domain)], state)
        self.readers.append(reader)
        return reader


def make_source(n: int, domains=("d",), shared_span_blocks=0):
    return ListSource([Seq(np.full(4, i, dtype=np.int32), domains[i % len(domains)], f"s:{i}:0", 4)
                       for i in range(n)], domains, shared_span_blocks)


def make_list_chunk_stream(cursor):
    """``make_stream(cursor)`` of a coordinator over 19 in-memory sequences (importable by Ray workers)."""
    from d3ray.data.chunker import ChunkStream

    return ChunkStream(make_source(19), batch_size=2, chunk_len=2, shuffle_buffer=3, seed=1, cursor=cursor)


class SketchOffers:
    """The ScheduleCoordinator's ``sketch_request`` contract (a Ray actor in the test): the refs and ids of
    an offered chunk, None for one offered as needing no scoring, waiting until the chunk is offered."""

    def __init__(self) -> None:
        self.offered: dict[int, tuple] = {}
        self.cond = threading.Condition()

    def offer(self, chunk_id: int, batches: list | None) -> None:
        import ray

        with self.cond:
            self.offered[chunk_id] = None if batches is None else (
                tuple(ray.put(b) for b in batches), [100 * chunk_id + i for i in range(len(batches))])
            self.cond.notify_all()

    def sketch_request(self, chunk_id: int):
        if chunk_id < 0:
            raise ValueError(f"no chunk {chunk_id}")
        with self.cond:
            while chunk_id not in self.offered:
                self.cond.wait()
            return self.offered[chunk_id]
