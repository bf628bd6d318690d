"""Run a phasekv-plan on a served model: ``python -m phasekv.run --help``.

Pure Python (httpx, tqdm); imports nothing else from phasekv.
"""
