"""HTTP service for the engines gpt2-deploy builds (FastAPI over pipeline.runtime)."""
