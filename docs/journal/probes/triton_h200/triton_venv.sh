# What the Triton sittings source once `gpt2-deploy serve` is done: a venv of numpy 1 (the Python backend
# stub's) before the machine's packages (its user site too, which a venv leaves out), with .tw's wheels
# and those a call before left in /tmp/parts (scipy 1.13.1), and nvidia-pytriton's tritonserver cut down
# (.tw/pytriton-slim.tar.xz); TP runs Python there.
python3 -m venv /tmp/tenv && /tmp/tenv/bin/python -m pip install -q --no-index --no-deps .tw/*.whl $(ls /tmp/parts/*.whl 2>/dev/null)
python3 -c "import site; print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in [*site.getsitepackages(), site.getusersitepackages()]))" \
  > "$(/tmp/tenv/bin/python -c 'import site; print(site.getsitepackages()[0])')/machine.pth"
mkdir -p /tmp/tsite && tar -C /tmp/tsite -xJf .tw/pytriton-slim.tar.xz
TP="env PYTHONPATH=/tmp/site:/tmp/tsite:$PWD /tmp/tenv/bin/python"
