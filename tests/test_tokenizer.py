from pipeline.tokenizer import embedded_gpt2_tokenizer, load_tokenizer


def test_real_gpt2_ids():
    tok = embedded_gpt2_tokenizer()
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok(" the quick brown fox")["input_ids"] == [262, 2068, 7586, 21831]
    assert len(tok) == 50257 and tok.eos_token_id == 50256


def test_round_trip_through_a_saved_folder(tmp_path):
    embedded_gpt2_tokenizer().save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    text = "Return the sum of a and b.\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left" and tok.pad_token_id == 50256
