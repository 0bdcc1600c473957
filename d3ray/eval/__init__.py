"""Evaluation through lm-evaluation-harness on local files: ppl, domains, cloze, choice, sft.

``prepare_tasks`` reads and validates task files (errors name file, line and field);
``run_eval_tasks(model, tokenizer, tasks)`` returns ``{"eval/<task>/<metric>": value}``, the
training loop's hook. lm-eval itself is imported on first use. See README.md in this folder.
"""

from __future__ import annotations

from d3ray.eval.harness import EvalReport, PreparedTask, evaluate_tasks, prepare_tasks, run_eval_tasks
from d3ray.eval.inputs import KINDS, EvalInputError, EvalTask, parse_task_specs

__all__ = [
    "KINDS",
    "EvalInputError",
    "EvalReport",
    "EvalTask",
    "PreparedTask",
    "evaluate_tasks",
    "parse_task_specs",
    "prepare_tasks",
    "run_eval_tasks",
]
