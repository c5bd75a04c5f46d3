"""The tool-call evaluation of a model package: the suite (``suite.json``, ``suite.py``), its
scoring (``scoring.py``) and the runner that drives a node agent with it (``runner.py``)."""
