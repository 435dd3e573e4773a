"""The tiny real model the vLLM tests and the calculator example serve (`build.py` builds it:
`python -m polar_hpc.engines.tiny OUT_DIR`); `template.py` is its Qwen3-style chat template,
`conversation.py` what it is taught. The build needs transformers and torch, which polar-hpc does
not require: the `tiny` extra (`pip install 'polar-hpc[tiny]'`) or vLLM's environment has them."""
