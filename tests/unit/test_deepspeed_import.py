"""``import_deepspeed`` (d3ray/deepspeed_import.py): DeepSpeed imported without its autotuner's MLflow import,
MLflow still importable afterwards, and an MLflow a process imported first left as it is. Each case runs in a
fresh interpreter (this test process may have imported either already)."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_python

pytest.importorskip("mlflow", reason="the case is DeepSpeed's autotuner importing an installed MLflow")


def test_deepspeed_imports_without_mlflow_and_mlflow_imports_after():
    seen = fresh_python(
        "import json, sys\n"
        "from d3ray.deepspeed_import import import_deepspeed\n"
        "ds = import_deepspeed()\n"
        "from deepspeed.autotuning import autotuner\n"
        "during = 'mlflow' in sys.modules\n"
        "import mlflow\n"
        "print(json.dumps({'same': ds is sys.modules['deepspeed'], 'mlflow_during': during,\n"
        "                  'autotuner_has_mlflow': autotuner.has_mlflow, 'mlflow_after': hasattr(mlflow, 'log_metric'),\n"
        "                  'again': import_deepspeed() is ds}))\n")
    assert seen == {"same": True, "mlflow_during": False, "autotuner_has_mlflow": False, "mlflow_after": True,
                    "again": True}


def test_an_mlflow_imported_first_stays_and_deepspeed_sees_it():
    seen = fresh_python(
        "import json, sys\n"
        "import mlflow\n"
        "from d3ray.deepspeed_import import import_deepspeed\n"
        "import_deepspeed()\n"
        "from deepspeed.autotuning import autotuner\n"
        "print(json.dumps({'kept': sys.modules['mlflow'] is mlflow, 'autotuner_has_mlflow': autotuner.has_mlflow}))\n")
    assert seen == {"kept": True, "autotuner_has_mlflow": True}
