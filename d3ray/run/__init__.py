"""The driver: what runs on the machine that starts a training run, before and around Ray Train's fit.

- ``command.py``: ``d3ray pretrain`` and ``d3ray finetune``; ``defaults.py``: the finetune default they
  and the studies share.
- ``prepare.py``: the run's data, tokenizer, eval sets and eval tasks, before Ray starts.
- ``preflight.py``: what the environment and the cluster lack for the run, one line each.
- ``cluster.py``: start or join Ray, and the environment every worker and actor gets.
- ``pretrain.py``: ``run_pretrain``: the coordinator, the scheduler's actors and the fit of
  ``d3ray.train.loop.train_loop_per_worker``; ``summary.py``: what it writes and prints at the end.

The worker (``d3ray/train/``) never imports this package: the driver hands it what it needs.
"""
