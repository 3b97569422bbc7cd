import pytest
import torch

from pipeline.config import PRESETS, load_config
from pipeline.errors import UserError


def test_presets_have_expected_shapes():
    assert (load_config("gpt2").model.n_layer, load_config("gpt2").model.n_embd) == (12, 768)
    tiny = load_config("tiny")
    assert tiny.model.n_layer < 12 and tiny.data.block_size <= tiny.model.n_positions
    assert set(PRESETS) >= {"tiny", "gpt2"}


def test_toml_file_then_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[train]\nlr = 1e-4\nsteps = 7\n[export]\nprecisions = ["fp32", "int8"]\n')
    cfg = load_config("tiny", f, ["train.steps=9", "train.warmup_steps=3", "train.checkpointing=true"])
    assert cfg.train.lr == 1e-4 and cfg.train.steps == 9 and cfg.train.checkpointing is True
    assert cfg.export.precisions == ["fp32", "int8"]


@pytest.mark.parametrize("override, message", [
    ("train.lr=-1", "train.lr must be positive"),
    ("data.block_size=4096", "data.block_size (4096) must be in (1, model.n_positions=256]"),
    ("train.precision=fp8", "train.precision 'fp8': choose one of"),
    ("train.nope=1", "unknown key 'train.nope'"),
    ("train.steps=many", "'many' is not a valid int"),
    ("model.n_head=3", "multiple of model.n_head"),
    ("export.precisions=fp32,int4", "export.precisions"),
    ("export.targets=portable,tflite", "export.targets ['portable', 'tflite']: choose from portable, ort"),
    ("train", "expected SECTION.KEY=VALUE"),
])
def test_invalid_values_are_rejected_with_the_key(override, message):
    with pytest.raises(UserError, match=None) as e:
        load_config("tiny", overrides=[override])
    assert message in str(e.value)


def test_unknown_preset_and_missing_or_bad_file(tmp_path):
    with pytest.raises(UserError, match="--preset 'huge' is unknown"):
        load_config("huge")
    with pytest.raises(UserError, match="no such file"):
        load_config("tiny", tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr=")
    with pytest.raises(UserError, match="not valid TOML"):
        load_config("tiny", bad)


@pytest.mark.parametrize("how", ["option", "set", "toml"])
@pytest.mark.parametrize("name", ["../../x", "/abs/path", "a/b", "..", ".hidden", "x.tmp"])
def test_a_run_folder_cannot_leave_the_artifacts_folder(tmp_path, how, name):
    if how == "option":
        call = lambda: load_config("tiny", run=name)  # noqa: E731
    elif how == "set":
        call = lambda: load_config("tiny", overrides=[f"run={name}"])  # noqa: E731
    else:
        (tmp_path / "c.toml").write_text(f"run = {name!r}\n")
        call = lambda: load_config("tiny", tmp_path / "c.toml")  # noqa: E731
    with pytest.raises(UserError, match="a run name is one folder name"):
        call()


def test_an_empty_run_name_is_refused_rather_than_taken_for_the_presets():
    with pytest.raises(UserError, match="--run '': give a run name, or leave --run out"):
        load_config("tiny", run="")


def test_error_labels_name_the_source_and_the_key_apart(tmp_path):
    with pytest.raises(UserError, match=r"^--set train.steps=abc: train.steps = 'abc' is not a valid int$"):
        load_config("tiny", overrides=["train.steps=abc"])
    (tmp_path / "badtype.toml").write_text('[train]\nsteps = "x"\n')
    with pytest.raises(UserError, match=r"badtype.toml: train.steps = 'x' is not a valid int$"):
        load_config("tiny", tmp_path / "badtype.toml")
    for value in ("inf", "nan", "-inf"):
        with pytest.raises(UserError, match=f"train.lr = '{value}' is not a finite number"):
            load_config("tiny", overrides=[f"train.lr={value}"])


def test_a_huge_wrong_value_is_quoted_by_its_head_and_length(tmp_path):
    (tmp_path / "huge.toml").write_text(f'[train]\nsteps = "{"x" * 3_000_000}"\n')
    with pytest.raises(UserError) as caught:
        load_config("tiny", tmp_path / "huge.toml")
    assert len(str(caught.value)) < 300 and "... (3000002 characters) is not a valid int" in str(caught.value)
    with pytest.raises(UserError) as caught:
        load_config("tiny", overrides=["train.steps=" + "y" * 3_000_000])
    assert len(str(caught.value)) < 300


def test_the_larger_presets_have_the_published_shapes():
    from pipeline.model import new_model

    shapes = {"gpt2-medium": (24, 16, 1024, 354.8e6), "gpt2-large": (36, 20, 1280, 774.0e6),
              "gpt2-xl": (48, 25, 1600, 1557.6e6)}
    for preset, (layers, heads, width, params) in shapes.items():
        cfg = load_config(preset)
        m = cfg.model
        assert (m.n_layer, m.n_head, m.n_embd, m.n_positions, m.vocab_size) == (layers, heads, width, 1024, 50257)
        t = cfg.train
        assert t.batch_size * t.grad_accum == 64 and t.checkpointing
        with torch.device("meta"):  # the shape alone: no memory for 1.5B weights
            n = sum(p.numel() for p in new_model(m, 0).parameters())
        assert abs(n - params) / params < 0.002, (preset, n)


def test_the_serve_section_takes_settings_and_refuses_bad_ones(tmp_path):
    toml = tmp_path / "serve.toml"
    toml.write_text('[serve]\nqueue = 5\nmax_rows = 16\ntimeout_s = 30.0\n')
    cfg = load_config("tiny", toml, ["serve.port=9000"])
    assert (cfg.serve.queue, cfg.serve.max_rows, cfg.serve.timeout_s, cfg.serve.port) == (5, 16, 30.0, 9000)
    with pytest.raises(UserError, match="serve.port 0"):
        load_config("tiny", overrides=["serve.port=0"])
    with pytest.raises(UserError, match="serve.max_body"):
        load_config("tiny", overrides=["serve.max_body=10"])
