"""Values just past each request limit (pipeline.runtime.sampling.LIMITS), for the tests that every
front door (the CLI's Sampling.check, serve's native and OpenAI routes, the Triton model) refuses
the same ones, naming the field."""

from pipeline.runtime.sampling import LIMITS

INTEGER_FIELDS = ("max_new_tokens", "top_k", "seed")


def values_past_the_limits(largest_int: int | None = None) -> list[tuple[str, float]]:
    """(Sampling field, a value it must refuse) for each end of each limit: an open end itself, a
    closed one a step outside; NaN for each float field. largest_int: skip integers past it (a door
    whose wire type cannot carry them refuses them before the model sees them)."""
    out = []
    for field, limit in LIMITS.items():
        integer = field in INTEGER_FIELDS
        for end, is_open, outward in ((limit.low, limit.low_open, -1), (limit.high, limit.high_open, 1)):
            if end is None:
                continue
            step = 1 if integer else max(abs(end), 1) * 1e-3
            value = end if is_open else end + outward * step
            if integer and largest_int is not None and abs(value) > largest_int:
                continue
            out.append((field, int(value) if integer else float(value)))
        if not integer:
            out.append((field, float("nan")))
    return out
