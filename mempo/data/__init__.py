"""Task datasets: the embedded synthetic world and its oracle teacher, QA files, the multi-objective composer,
the DataModule."""
