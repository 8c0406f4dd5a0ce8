"""Scaling studies: the IsoFLOP fits (fit.py), the report and its plots (report.py), and the study
that runs the jobs as a Hydra multirun (study.py); compute accounting is the model's
(gpt.model.compute)."""
