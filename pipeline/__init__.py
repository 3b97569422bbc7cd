"""gpt2-deploy: GPT-2 from fine-tuning to validated, benchmarked inference engines."""

__version__ = "0.1.0"
