"""A reward for tests/engine/test_real_model.py: the response's length in characters / 1000.
Almost any two responses score differently, so every GRPO group has nonzero advantages and
every step moves the weights; the task's own reward often gives a whole small group the
same score, and a step without a gradient would leave the weight sync unchecked."""


def reward(prompt: str, response: str, answer: str) -> float:
    return len(response) / 1000
