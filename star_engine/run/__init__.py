"""A run: Algorithm 1 (``loop``) and its steps (``stages``, ``stagebase``, ``verifying``,
``tuning``, ``questions``, ``tokens``, ``verdicts``, ``labelfree``), the experiment's components
built from the configuration (``experiment``), the components tried on a few questions before a
run (``trial``), the checks and start of a run (``runner``) and many runs of one file
(``sweep``)."""
