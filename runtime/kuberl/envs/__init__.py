"""Environments for multi-turn rollout (spec.environment): the interface a user's class implements, the loader,
the built-in tool-calling environment. None of these import torch (an environment's process needs none); the
trajectory's tensors are in `kuberl.envs.trajectory`."""

from .calculator import CalculatorError, calculator
from .interface import Environment, EnvStep, EnvStepError, Messages, coerce_reset, coerce_step
from .loader import EnvironmentImportError, environment_factory, load_environment_class, make_environment
from .tools import BadToolCall, ToolCall, ToolEnvironment, ToolRegistry, ToolResult, parse_tool_calls, tool

__all__ = ["BadToolCall", "CalculatorError", "EnvStep", "EnvStepError", "Environment", "EnvironmentImportError",
           "Messages", "ToolCall", "ToolEnvironment", "ToolRegistry", "ToolResult", "calculator", "coerce_reset",
           "coerce_step", "environment_factory", "load_environment_class", "make_environment", "parse_tool_calls",
           "tool"]
