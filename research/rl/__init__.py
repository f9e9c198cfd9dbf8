"""The black-box RL loop (issue 6): rollouts through harnesses -> trees -> GRPO/PPO/SFT -> weights."""
