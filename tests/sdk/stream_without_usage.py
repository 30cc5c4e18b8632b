"""A streamed chat completion that did not ask for usage: the chunks
concatenate to the non-streamed answer, no chunk carries usage (the
gateway asked for it on the client's behalf and took it out), and the
tenant's token budget was settled with exactly the simulator's usage."""

from levee_sdk import MESSAGES, MODEL, client, env, settled_tokens, sim_usage, tenant_tokens

SIM = env("SIM_URL")
TENANT = env("LEVEE_TENANT")
c = client()

whole = c.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content
assert whole, "the non-streamed answer is empty"

before = sim_usage(SIM)
tokens_before = tenant_tokens(TENANT)
stream = c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
chunks = list(stream)
after = sim_usage(SIM)

text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
with_usage = [i for i, ch in enumerate(chunks) if ch.usage is not None]
print(f"{len(chunks)} chunks, streamed answer: {text!r}")
assert text == whole, f"streamed answer {text!r} != non-streamed {whole!r}"
assert not with_usage, f"chunks {with_usage} carry usage the client did not ask for: {chunks[with_usage[0]].usage}"
assert all(ch.choices for ch in chunks), "a chunk with no choices (the usage chunk) reached the client"

completions = after[0] - before[0]
prompt = after[1] - before[1]
completion = after[2] - before[2]
injected = after[3] - before[3]
print(f"simulator delta: completions={completions} prompt={prompt} completion={completion} include_usage={injected}")
assert completions == 1, f"the simulator answered {completions} completions for one stream"
assert injected == 1, f"the gateway asked the simulator for usage on {injected} streams (want 1)"

delta = settled_tokens(TENANT, tokens_before, prompt + completion)
assert delta == prompt + completion, (
    f"tenant {TENANT} was charged {delta} tokens, the stream used {prompt}+{completion}={prompt + completion}"
)
print("ok")
