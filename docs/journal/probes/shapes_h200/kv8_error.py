"""How far one-byte KV caches move attention's output, in torch on a CPU (#50, #51): one decode
query over 192 slots (gpt2-xl's 25 heads of 64, batch 8), unit-Gaussian keys and values (real
caches have outliers: a bound on the rounding alone, not on GPT-2), relative error of the output
against fp32's for fp8 (e4m3, no scale), and int8 with a scale per (slot, head) or per (head, channel).
python docs/journal/probes/shapes_h200/kv8_error.py"""

import torch


def main() -> None:
    torch.manual_seed(0)
    k, v, q = torch.randn(8, 25, 192, 64), torch.randn(8, 25, 192, 64), torch.randn(8, 25, 1, 64)

    def attention(keys, values):
        return torch.softmax(q @ keys.transpose(-1, -2) / 8, -1) @ values

    def int8(t, dims):
        scale = t.abs().amax(dims, keepdim=True) / 127
        return (t / scale).round().clamp(-127, 127) * scale

    reference = attention(k, v)
    for name, rounded in (("fp8 e4m3, no scale", lambda t: t.to(torch.float8_e4m3fn).float()),
                          ("int8, a scale per (slot, head)", lambda t: int8(t, -1)),
                          ("int8, a scale per (head, channel)", lambda t: int8(t, -2))):
        out = attention(rounded(k), rounded(v))
        print(f"{name:34} relative error {((out - reference).norm() / reference.norm()).item():.1e}")


if __name__ == "__main__":
    main()
