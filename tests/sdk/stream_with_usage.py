"""A streamed chat completion that asked for usage: the last chunk carries
the simulator's figures, and the tenant was charged exactly those."""

from levee_sdk import MESSAGES, MODEL, client, env, settled_tokens, sim_usage, tenant_tokens

SIM = env("SIM_URL")
TENANT = env("LEVEE_TENANT")

before = sim_usage(SIM)
tokens_before = tenant_tokens(TENANT)
stream = client().chat.completions.create(
    model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
)
chunks = list(stream)
after = sim_usage(SIM)

assert chunks, "the stream was empty"
last = chunks[-1]
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
print(f"{len(chunks)} chunks, answer {text!r}, last chunk usage: {last.usage}")
assert text.strip(), "the streamed answer is empty"
assert last.usage is not None, f"the last chunk carries no usage: {last}"
assert last.choices == [], f"the usage chunk has choices: {last.choices}"
assert all(ch.usage is None for ch in chunks[:-1]), "usage on a chunk before the last"

prompt = after[1] - before[1]
completion = after[2] - before[2]
print(f"simulator delta: completions={after[0] - before[0]} prompt={prompt} completion={completion} include_usage={after[3] - before[3]}")
assert after[0] - before[0] == 1, "the simulator answered more or less than one completion"
assert after[3] - before[3] == 1, "the simulator did not see include_usage"
assert last.usage.prompt_tokens == prompt, f"usage.prompt_tokens {last.usage.prompt_tokens} != simulator's {prompt}"
assert (
    last.usage.completion_tokens == completion
), f"usage.completion_tokens {last.usage.completion_tokens} != simulator's {completion}"
assert last.usage.total_tokens == prompt + completion, f"usage.total_tokens {last.usage.total_tokens}"

total = last.usage.total_tokens
delta = settled_tokens(TENANT, tokens_before, total)
assert delta == total, f"tenant {TENANT} was charged {delta} tokens, the stream's usage says {total}"
print("ok")
