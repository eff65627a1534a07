"""Programs as rationales for star-engine: the ``code`` task (HumanEval and MBPP layouts), the generated
``code_expr`` task, the sandboxed ``python_tests`` checker and the ``code_tests`` hint."""

from .checker import PythonTestsChecker, gold_answer, read_gold
from .expr import CodeExprTask
from .task import CodeTask, TestsHint

__all__ = ["CodeExprTask", "CodeTask", "PythonTestsChecker", "TestsHint", "gold_answer", "read_gold"]
