"""Evaluation through lm-evaluation-harness: local files → lm-eval tasks → metrics ``eval/<task>/<metric>``.

    KIND=FILE specs ─► inputs.py (read + validate, in this process) ─► PreparedTask: lm-eval task
    configs whose ``custom_dataset`` returns the validated examples (no hub, no download script)
        │
        ▼ lm_eval.simple_evaluate(HFLM(pretrained=<model instance>, tokenizer=<tokenizer>), configs,
        │                         TaskManager(include_defaults=False), no global reseeding)
        ▼
    {"eval/cloze:lambada/acc": 0.41, "eval/sft:test/add:3/exact_match": 0.2, ...}

lm-eval does the scoring: rolling log-likelihood perplexities (``ppl``, ``domains``), continuation
log-likelihood and greedy match (``cloze``), choice log-likelihoods (``choice``), greedy generation
(``sft``). Written here: building the task configs, the SFT exact match by the suite's recomputing
checker (a ``process_results`` of three lines), and the SFT breakdown by skill and difficulty
from lm-eval's logged samples (lm-eval aggregates per task only). See README.md for what lm-eval
cannot do here.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from d3ray.data.ledger import BadRecordLedger
from d3ray.eval.inputs import (
    EvalTask,
    parse_task_specs,
    read_choice,
    read_cloze,
    read_domain_documents,
    read_text_document,
)

logger = logging.getLogger(__name__)


@dataclass
class PreparedTask:
    """A validated task: its lm-eval configs (one per domain for ``domains``) and example counts."""

    task: EvalTask
    configs: list[dict[str, Any] | str]
    """lm-eval task configs, or (kind ``lm-eval``) the task's name in lm-eval's index."""
    n_examples: int
    data_quality: dict[str, Any] | None = None
    index: tuple[str | None, bool] | None = None
    """Kind ``lm-eval``: the TaskManager that knows the name, as (include_path, include_defaults)."""


@dataclass
class EvalReport:
    """Metrics plus what was evaluated, for the JSON file and the printed table."""

    metrics: dict[str, float]
    examples: dict[str, int] = field(default_factory=dict)
    data_quality: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "examples": self.examples, "data_quality": self.data_quality,
                "seconds": self.seconds}

    def format_table(self) -> str:
        rows = [("task", "metric", "value")]
        for key, value in sorted(self.metrics.items()):
            task, metric = key.removeprefix("eval/").rsplit("/", 1)
            rows.append((task, metric, f"{value:.4f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


class _LocalExamples:
    """lm-eval's ``custom_dataset``: the validated examples as a one-split ``DatasetDict`` (in memory).
    Its short repr is what lm-eval records as the task's dataset in the results' configs."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs

    def __call__(self, **_: Any) -> Any:
        import datasets

        return datasets.DatasetDict({"test": datasets.Dataset.from_list(self.docs)})

    def __repr__(self) -> str:
        return f"<{len(self.docs)} validated local examples>"


def _config(name: str, docs: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"task": name, "custom_dataset": _LocalExamples(docs), "test_split": "test",
            "num_fewshot": 0, "metadata": {"version": 1}, **fields}


def _metric(name: str, aggregation: str, higher_is_better: bool) -> dict[str, Any]:
    return {"metric": name, "aggregation": aggregation, "higher_is_better": higher_is_better}


_ROLLING = {
    "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "text",
    "metric_list": [_metric("word_perplexity", "weighted_perplexity", False),
                    _metric("byte_perplexity", "weighted_perplexity", False),
                    _metric("bits_per_byte", "bits_per_byte", False)],
}


def _sft_exact_match(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    from d3ray.data.skills import exact_match

    # the suite: the answer recomputed from the prompt; other tasks: the normalized reference
    return {"exact_match": float(exact_match(doc["task"], doc["prompt"], results[0], doc["response"]))}


def cloze_target(context: str, continuation: str) -> str:
    """The scored text after the context: the continuation, after one space unless the context ends
    with whitespace or the continuation starts with it (lm-eval's loglikelihood requests join the two
    verbatim; its LAMBADA task writes the space into the target the same way)."""
    if context[-1:].isspace() or continuation[:1].isspace():
        return continuation
    return " " + continuation


def prepare_task(task: EvalTask, tokenizer: Any, max_docs_per_domain: int | None = None) -> PreparedTask:
    """Read and validate ``task``'s files and build its lm-eval task configs.

    Raises:
        EvalInputError: a file or line is not what the kind needs (names file, line and field).
    """
    if task.kind == "ppl":
        docs = [{"text": read_text_document(task.path)}]
        return PreparedTask(task, [_config(task.name, docs, **_ROLLING)], len(docs))
    if task.kind == "domains":
        ledger = BadRecordLedger()
        per_domain = read_domain_documents(task.path, ledger, max_docs_per_domain)
        configs = [_config(f"{task.name}:{d}", [{"text": t} for t in texts], **_ROLLING)
                   for d, texts in per_domain.items()]
        return PreparedTask(task, configs, sum(map(len, per_domain.values())), ledger.to_dict())
    if task.kind == "cloze":
        docs = [{**d, "target": cloze_target(d["context"], d["continuation"])} for d in read_cloze(task.path)]
        return PreparedTask(task, [_config(
            task.name, docs, output_type="loglikelihood", doc_to_text="context", doc_to_target="target",
            target_delimiter="", metric_list=[_metric("perplexity", "perplexity", False), _metric("acc", "mean", True)],
        )], len(docs))
    if task.kind == "choice":
        docs = read_choice(task.path)
        return PreparedTask(task, [_config(
            task.name, docs, output_type="multiple_choice", doc_to_text="context", doc_to_choice="choices",
            doc_to_target="label", target_delimiter=" ",
            metric_list=[_metric("acc", "mean", True), _metric("acc_norm", "mean", True)],
        )], len(docs))
    return _prepare_sft(task, tokenizer)


def _prepare_sft(task: EvalTask, tokenizer: Any) -> PreparedTask:
    from d3ray.data.sft import render_record
    from d3ray.data.sft_sequences import read_sft_records
    from d3ray.eval.inputs import EvalInputError

    try:
        records = read_sft_records([task.path])
    except (ValueError, FileNotFoundError) as err:
        raise EvalInputError(f"kind sft: {err}") from err
    docs = []
    for r in records:
        docs.append({"prompt_text": render_record(r, tokenizer)[0], "prompt": r.prompt, "response": r.response,
                     "task": r.task, "difficulty": -1 if r.difficulty is None else r.difficulty})
    longest = max(len(ids) for ids in tokenizer([d["response"] for d in docs], add_special_tokens=False)["input_ids"])
    single_line = all("\n" not in d["response"].strip() for d in docs)
    generation = {"until": ["\n"] if single_line else [], "max_gen_toks": longest + 4, "do_sample": False}
    return PreparedTask(task, [_config(
        task.name, docs, output_type="generate_until", doc_to_text="prompt_text", doc_to_target="response",
        target_delimiter="", generation_kwargs=generation, process_results=_sft_exact_match,
        metric_list=[_metric("exact_match", "mean", True)],
    )], len(docs))


def prepare_tasks(tasks: str | list[EvalTask], tokenizer: Any, max_docs_per_domain: int | None = None) -> list[PreparedTask]:
    """Parse (if a spec string) and prepare every task; all input errors surface here, before any model work."""
    specs = parse_task_specs(tasks) if isinstance(tasks, str) else tasks
    return [prepare_task(t, tokenizer, max_docs_per_domain) for t in specs]


def evaluate_tasks(
    model: Any, tokenizer: Any, tasks: list[PreparedTask], batch_size: int = 64, limit: int | None = None
) -> EvalReport:
    """Run prepared tasks through lm-eval on an already-built model; its train/eval mode is restored.

    Args:
        model: a transformers causal LM (or peft model), on its device.
        tokenizer: its tokenizer (fast, with an EOS token).
        tasks: from :func:`prepare_tasks`.
        batch_size: lm-eval requests per forward pass.
        limit: at most this many examples per lm-eval task (None = all).
    """
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    configs = [c for t in tasks for c in t.configs]
    log_samples = any(t.task.kind == "sft" for t in tasks)
    indexes = {t.index for t in tasks if t.index is not None}  # named tasks (named.py): one index for all
    include_path, include_defaults = max(indexes, key=lambda i: i[1]) if indexes else (None, False)
    was_training = model.training
    start = time.perf_counter()
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        out = lm_eval.simple_evaluate(
            model=lm, tasks=configs, task_manager=TaskManager(include_path=include_path,
                                                              include_defaults=include_defaults), limit=limit,
            bootstrap_iters=0, log_samples=log_samples, random_seed=None, numpy_random_seed=None,
            torch_random_seed=None, fewshot_random_seed=None,
        )
    finally:
        model.train(was_training)
    metrics: dict[str, float] = {}
    for name, values in out["results"].items():
        for key, value in values.items():
            metric, _, filt = key.partition(",")
            if filt and not metric.endswith("_stderr") and isinstance(value, int | float):
                # lm-eval's own tasks may score under named filters (gsm8k: strict-match): metric:filter
                metrics[f"eval/{name}/{metric}" + ("" if filt == "none" else f":{filt}")] = float(value)
    for t in tasks:
        if t.task.kind == "sft":
            metrics.update(sft_breakdown(t.task.name, out["samples"][t.task.name]))
    return EvalReport(
        metrics=metrics,
        examples={name: int(n["effective"]) for name, n in out.get("n-samples", {}).items()},
        data_quality={t.task.name: t.data_quality for t in tasks if t.data_quality is not None},
        seconds=time.perf_counter() - start,
    )


def sft_breakdown(name: str, samples: list[dict[str, Any]]) -> dict[str, float]:
    """Mean exact match per skill (``eval/<name>:<skill>/exact_match``) and per skill and difficulty
    (``eval/<name>:<skill>:d<k>/exact_match``) from lm-eval's logged samples."""
    groups: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        doc, value = sample["doc"], float(sample["exact_match"])
        groups[f"{name}:{doc['task']}"].append(value)
        if doc["difficulty"] >= 0:
            groups[f"{name}:{doc['task']}:d{doc['difficulty']}"].append(value)
    return {f"eval/{key}/exact_match": math.fsum(v) / len(v) for key, v in sorted(groups.items())}


def run_eval_tasks(
    model: Any, tokenizer: Any, tasks: str | list[EvalTask] | list[PreparedTask], batch_size: int = 64,
    limit: int | None = None,
) -> dict[str, float]:
    """The training loop's hook: metrics ``eval/<task>/<metric>`` of ``tasks`` on ``model``.

    Pass :func:`prepare_tasks`' result to read the files once (at startup, so bad input fails
    before training); a spec string or :class:`EvalTask` list is prepared on every call.
    """
    if isinstance(tasks, str) or (tasks and isinstance(tasks[0], EvalTask)):
        tasks = prepare_tasks(tasks, tokenizer)  # type: ignore[arg-type]
    return evaluate_tasks(model, tokenizer, tasks, batch_size, limit).metrics  # type: ignore[arg-type]
