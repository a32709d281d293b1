"""The evaluation harness: datasets, runner, metrics, reports, benchmarks and `mia train retriever`.

It needs the ``eval`` extra's packages. Importing it without them fails at once, so that the
``mia`` command (which loads the harness's commands through entry points and skips those that do
not import) lists no command that would fail halfway.
"""

from importlib.util import find_spec

_EXTRA = ("matplotlib", "psutil", "selenium")
_missing = [name for name in _EXTRA if find_spec(name) is None]
if _missing:
    raise ImportError(f"the evaluation harness needs {', '.join(_missing)}: python -m pip install 'mia[eval]'")
