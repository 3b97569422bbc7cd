"""Where int8-wo's logits error comes from on a checkpoint: the model with every product's weight
quantised and dequantised in fp32 (int8_weights' rule), with and without its layer norms folded
first, with the LM head in float or int8, each against the model itself on random tokens.
    python docs/journal/probes/int8_weights/head_error.py RUN/checkpoint"""

import copy
import sys

import torch

from pipeline.int8_weights import folded_model, quantize_rows
from pipeline.model import load_checkpoint


def dequantised(w: torch.Tensor) -> torch.Tensor:
    """w [out, in] through int8 and back."""
    q, scale = quantize_rows(w)
    return q.float() * scale[:, None]


def quantised(model, head: bool):
    """A copy of `model` with its products' weights (and the LM head's, with head) through int8."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.transformer.h:
            for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                linear.weight.copy_(dequantised(linear.weight.t()).t())  # Conv1D: [in, out]
        if head:
            untied = torch.nn.Linear(out.config.n_embd, out.config.vocab_size, bias=out.lm_head.bias is not None)
            untied.weight.data = dequantised(out.lm_head.weight.detach())
            if out.lm_head.bias is not None:
                untied.bias.data = out.lm_head.bias.detach().clone()
            out.config.tie_word_embeddings = False
            out.lm_head = untied
    return out


def main() -> None:
    torch.manual_seed(0)
    model = load_checkpoint(sys.argv[1]).float().eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 64))
    with torch.no_grad():
        reference = model(ids).logits
        folded = folded_model(model)
        print(f"folded, not quantised: relative logits error {(folded(ids).logits - reference).norm() / reference.norm():.2e}")
        for name, base in (("unfolded", model), ("folded", folded)):
            for head in (False, True):
                logits = quantised(base, head)(ids).logits
                print(f"{name}, LM head {'int8' if head else 'float'}: {(logits - reference).norm() / reference.norm():.2e}")


if __name__ == "__main__":
    main()
