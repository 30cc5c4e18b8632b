"""A non-streamed chat completion through the SDK: a non-empty answer whose
usage is exactly what the simulator produced for it."""

from levee_sdk import MESSAGES, MODEL, client, env, sim_usage

SIM = env("SIM_URL")

before = sim_usage(SIM)
resp = client().chat.completions.create(model=MODEL, messages=MESSAGES)
after = sim_usage(SIM)

content = resp.choices[0].message.content
print(f"answer: {content!r}")
print(f"usage: {resp.usage}")
assert content and content.strip(), f"empty answer: {resp}"
assert resp.choices[0].finish_reason == "stop", f"finish_reason {resp.choices[0].finish_reason!r}"
assert resp.usage is not None, "the response carries no usage"

completions = after[0] - before[0]
prompt = after[1] - before[1]
completion = after[2] - before[2]
print(f"simulator delta: completions={completions} prompt={prompt} completion={completion}")
assert completions == 1, f"the simulator answered {completions} completions for one call"
assert resp.usage.prompt_tokens == prompt, f"usage.prompt_tokens {resp.usage.prompt_tokens} != simulator's {prompt}"
assert (
    resp.usage.completion_tokens == completion
), f"usage.completion_tokens {resp.usage.completion_tokens} != simulator's {completion}"
assert resp.usage.total_tokens == prompt + completion, f"usage.total_tokens {resp.usage.total_tokens}"
print("ok")
