"""A run: Algorithm 1 (``loop``) and its steps (``stages``, ``stagebase``, ``verifying``,
``tuning``, ``questions``, ``tokens``, ``verdicts``, ``preferences``, ``labelfree``), the
experiment's components built from the configuration (``experiment``), seeds (``seeds``), the
checks and start of a run (``runner``) and many runs of one file (``sweep``)."""
