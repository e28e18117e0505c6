"""The `RLTrainingJob` spec model (kuberl.io/v1alpha1): pure pydantic, no torch, no ray.

Field names are camelCase in YAML (Kubernetes style) and snake_case in Python. Every section has
defaults, so a manifest names only what it changes. Cross-field rules live in `_check_*` validators
on `JobSpec` and report the full field path.
"""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .base import DNS_SUBDOMAIN, Section
from .quantity import INT64_MAX, Quantity, parse_quantity
from .scheduling import GPU_PRODUCT_LABEL, Scheduling, check_labels, label_key_problem

GROUP = "kuberl.io"
VERSION = "v1alpha1"
KIND = "RLTrainingJob"
PLURAL = "rltrainingjobs"
SHORT_NAME = "rltj"
API_VERSION = f"{GROUP}/{VERSION}"

ROLES: tuple[str, ...] = ("actor", "critic", "ref", "reward", "rollout", "env")  # the built-in roles: spec.roles.<role>
TRAINING_ROLES: tuple[str, ...] = ("actor", "critic")  # the roles with an optimizer (offload and LoRA apply to these)
ROLE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,18}[a-z0-9])?$")  # an extra role's name: a short DNS label


def role_resource(role: str) -> str:
    """The custom Ray resource a role's pods advertise and its Ray actors request (one unit per rank)."""
    return f"kuberl_role_{role}"


NODE_RESOURCE_PREFIX = "kuberl_node_"
"""On Kubernetes every worker pod also advertises ``kuberl_node_<node name>`` (one unit per GPU, or one
on CPU): its topology domain, the Kubernetes node it runs on. Pods of one node share it, so a bundle
asking for ``node_resource(n)`` lands on node ``n`` (docs/placement.md)."""


def node_resource(node: str) -> str:
    """The custom Ray resource of the worker pods on Kubernetes node ``node``."""
    return f"{NODE_RESOURCE_PREFIX}{node}"

BuiltinModel = Literal["tiny", "qwen2-0.5b", "qwen2-1.5b", "qwen2-7b"]
BuiltinTask = Literal["repeat-letter", "gsm8k-toy"]
BUILTIN_MODELS: tuple[str, ...] = get_args(BuiltinModel)
BUILTIN_TASKS: tuple[str, ...] = get_args(BuiltinTask)
# Built-in names of each registry (kuberl.registry): the runtime attaches the implementations.
ADVANTAGE_ESTIMATOR_NAMES: tuple[str, ...] = ("gae", "grpo", "drgrpo", "rloo", "reinforce++")
POLICY_LOSS_NAMES: tuple[str, ...] = ("clip", "reinforce", "gspo")
KL_ESTIMATOR_NAMES: tuple[str, ...] = ("k1", "k3")
LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
REWARD_FUNCTION_NAMES: tuple[str, ...] = ("repeat-letter", "gsm8k", "environment")
# Upper bounds on counts: far above any real job, low enough that a typo (an extra digit, 1e12) is refused here
# instead of exhausting memory or wrapping a 64-bit counter in a worker.
MAX_STEPS = 1_000_000  # training steps, and what counts steps (intervals, warmup, a fault's step)
MAX_TOKENS = 1 << 20  # prompt or response tokens; the model's context bounds their sum (BUILTIN_MAX_POSITIONS)
MAX_BATCH = 1 << 16  # prompts per step
MAX_GROUP = 1024  # samples per prompt
MAX_SAMPLES = 1 << 24  # samples (mini- and micro-batches; the adaptive KL horizon is in samples too)
MAX_ROWS = 1 << 24  # prompts read from files
MAX_REPLICAS = 1024  # replicas of a role
MAX_GPUS = 64  # GPUs per replica (one pod: one node's GPUs)
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts: a week
MAX_DEADLINE_SECONDS = 365 * 24 * 3600.0  # a job's own deadline and TTL: a year
MANAGED_BY_KUBERL = "kuberl.io/operator"  # spec.managedBy of the jobs kuberl's operator reconciles (or none)
MANAGED_BY_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"  # domain/name, as Job's
RESTART_RESTORE_SECONDS = 600.0  # past startTimeoutSeconds, what a restarted role may take to load and restore
BUILTIN_MAX_POSITIONS = 4096
"""The built-in models' context (max_position_embeddings, kuberl.training.models): data.maxPromptLength +
rollout.maxNewTokens must fit in it."""
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def named_or_path(names: tuple[str, ...], what: str = "function"):
    """A field validator: one of `names`, or an import path `package.module:name`."""

    def check(cls, v: str | None) -> str | None:
        if v is not None and v not in names and not IMPORT_PATH.match(v):
            raise ValueError(f"{v!r} is neither one of {', '.join(names)} nor an import path of the form "
                             f"package.module:{what}")
        return v

    return classmethod(check)


def name_or_path_schema(names: tuple[str, ...]) -> dict:
    """The CRD's pattern for such a field (the API server refuses anything else)."""
    alternatives = "|".join(re.escape(n) for n in names)
    return {"pattern": f"^({alternatives}|{IMPORT_PATH.pattern[1:-1]})$"}


class ModelSource(Section):
    """Where a model comes from: exactly one of a hub id, a local path, or a built-in config.

    Built-ins are random-initialised Qwen2-shaped models with a locally built tokenizer:
    `tiny` (CPU quickstart), `qwen2-0.5b`, `qwen2-1.5b` and `qwen2-7b` (GPU benchmarks).
    """

    hub: str | None = Field(None, description="Hugging Face hub id, e.g. Qwen/Qwen2-0.5B.")
    path: str | None = Field(None, description="Local directory with config, weights and tokenizer.")
    builtin: BuiltinModel | None = Field(
        None, description="Built-in small config plus a locally built tokenizer; no download."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("hub", "path", "builtin") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"give only one of hub, path, builtin (got {', '.join(given)})")
        return self

    def is_set(self) -> bool:
        return bool(self.hub or self.path or self.builtin)


class ModelSpec(ModelSource):
    """The policy model (actor, ref, and the critic's trunk); the built-in `tiny` when none is given."""

    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for training.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")

    @model_validator(mode="after")
    def _default_builtin(self) -> ModelSpec:
        if not self.is_set():
            self.builtin = "tiny"
        return self


class KLSpec(Section):
    """KL penalty against the reference policy."""

    coef: float = Field(0.01, ge=0, description="Initial KL coefficient (beta).")
    estimator: str = Field("k1", json_schema_extra=name_or_path_schema(KL_ESTIMATOR_NAMES),
                           description="k1 = log-ratio; k3 = Schulman's unbiased, >= 0; or package.module:function.")
    controller: Literal["fixed", "adaptive"] = Field("fixed",
                                                     description="Fixed or adaptive (Ziegler 2019) coefficient.")
    target: float | None = Field(None, gt=0, description="Target KL for the adaptive controller.")
    horizon: int = Field(10000, ge=1, le=MAX_SAMPLES, description="Adaptive controller horizon, in samples.")
    in_reward: bool = Field(True, description="PPO: subtract the KL from token rewards; GRPO always adds it to the "
                                              "loss.")

    _estimator = field_validator("estimator")(named_or_path(KL_ESTIMATOR_NAMES))


class DynamicSamplingSpec(Section):
    """DAPO's dynamic sampling (Yu et al. 2025): a group whose responses all score the same has no advantage, so it
    is dropped and the batch refilled from more prompts."""

    max_rounds: int = Field(3, ge=1, le=100,
                            description="Rollouts a step may draw, its first included; a batch still short after "
                                        "them is filled with groups that all scored the same (the "
                                        "groups_informative_ratio metric says how many were).")


class AlgorithmSpec(Section):
    name: Literal["ppo", "grpo", "reinforce"] = Field(
        "ppo", description="ppo (critic + GAE), grpo (group-normalised, no critic) or reinforce (no critic, "
                           "advantageEstimator's advantages, groups of groupSize >= 1).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_ratio: float = Field(0.2, gt=0, lt=1, description="PPO policy clip ratio epsilon.")
    clip_low: float | None = Field(None, gt=0, lt=1, description="The ratio's lower clip, 1 - clipLow (default "
                                                                "clipRatio); verl's clip_ratio_low.")
    clip_high: float | None = Field(None, gt=0, le=10, description="The ratio's upper clip, 1 + clipHigh (default "
                                                                  "clipRatio; DAPO's clip-higher: 0.28); verl's "
                                                                  "clip_ratio_high.")
    value_clip: float = Field(0.2, gt=0, description="Critic value clip range.")
    kl: KLSpec = Field(default_factory=KLSpec)
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    group_size: int = Field(1, ge=1, le=MAX_GROUP,
                            description="grpo, reinforce: responses sampled per prompt (grpo: >= 2).")
    normalize_advantages: bool = Field(True, description="PPO: whiten advantages over the batch.")
    advantage_estimator: str | None = Field(
        None, json_schema_extra=name_or_path_schema(ADVANTAGE_ESTIMATOR_NAMES),
        description="gae (ppo's default), grpo (grpo's default), drgrpo (grpo without the std division: Dr. "
                    "GRPO), rloo, reinforce++ (reinforce's default), or package.module:function.")
    tis: Literal["auto", "on", "off"] = Field(
        "auto", description="Truncated importance sampling (Yao et al. 2025): each token of the policy loss weighted "
                            "by min(exp(old log-prob - the rollout engine's), tisCap), correcting the engine/trainer "
                            "mismatch. auto: on with rollout.asynchronous or rollout.async.")
    tis_cap: float = Field(2.0, ge=1, le=1000, description="The truncated importance weight's cap.")
    dynamic_sampling: DynamicSamplingSpec | None = Field(
        None, description="Keep only groups whose rewards differ, refilling the batch (DAPO); needs groupSize >= 2. "
                          "Off by default.")
    loss_aggregation: LossAggregation = Field(
        "token-mean", description="How the actor's per-token loss terms become one loss per mini-batch: token-mean "
                                  "(every token alike), seq-mean-token-mean (each sequence alike), seq-mean-token-sum "
                                  "(each sequence's sum), seq-mean-token-sum-norm (sums over a constant, the response "
                                  "length: Dr. GRPO). verl's loss_agg_mode.")
    policy_loss: str = Field("clip", json_schema_extra=name_or_path_schema(POLICY_LOSS_NAMES),
                             description="clip (PPO's clipped surrogate), reinforce (unclipped), gspo (one clipped "
                                         "ratio per sequence: GSPO), or package.module:function.")

    _named = field_validator("advantage_estimator")(named_or_path(ADVANTAGE_ESTIMATOR_NAMES))
    _loss = field_validator("policy_loss")(named_or_path(POLICY_LOSS_NAMES))

    @property
    def estimator(self) -> str:
        """The advantage estimator in use: the spec's, else gae for ppo and grpo for grpo."""
        return self.advantage_estimator or {"ppo": "gae", "grpo": "grpo", "reinforce": "reinforce++"}[self.name]

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """(1 - clipLow, 1 + clipHigh): the importance ratio's clip range, clipRatio on a side left unset."""
        low = self.clip_ratio if self.clip_low is None else self.clip_low
        high = self.clip_ratio if self.clip_high is None else self.clip_high
        return 1.0 - low, 1.0 + high

    @property
    def kl_in_reward(self) -> bool:
        """Whether the KL penalty shapes the token rewards (ppo with kl.inReward) or enters the loss."""
        return self.name == "ppo" and self.kl.in_reward


def _check_formats(files: list[str]) -> list[str]:
    for f in files:
        if not f.endswith((".jsonl", ".parquet")):
            raise ValueError(f"{f!r} must end in .jsonl or .parquet")
    return files


class EvalSpec(Section):
    """Held-out prompts, answered greedily every `interval` steps and at the last step, scored by the
    job's reward: `eval_reward_mean` in metrics.jsonl, TensorBoard and the reward curve."""

    task: BuiltinTask | None = Field(
        None, description="A built-in task's held-out split (rows generated apart from training's). "
                          "Default, without files: the held-out split of spec.data.task.")
    files: list[str] = Field(default_factory=list,
                             description="Held-out jsonl or parquet files (spec.data's promptKey/answerKey).")
    interval: int = Field(10, ge=1, le=MAX_STEPS,
                          description="Steps between evaluations (the last step is always evaluated).")
    max_prompts: int = Field(64, ge=1, le=MAX_ROWS,
                             description="Evaluate at most this many prompts, the first ones in file order.")

    @field_validator("files")
    @classmethod
    def _known_formats(cls, files: list[str]) -> list[str]:
        return _check_formats(files)

    @model_validator(mode="after")
    def _one_source(self) -> EvalSpec:
        if self.task and self.files:
            raise ValueError("give either task or files, not both")
        return self


class DataSpec(Section):
    task: BuiltinTask | None = Field(
        None, description="Built-in task (prompts generated locally). Exclusive with files."
    )
    files: list[str] = Field(default_factory=list, description="jsonl or parquet files of prompts.")
    prompt_key: str = Field("prompt", min_length=1, description="Field holding the prompt text.")
    answer_key: str = Field("answer", min_length=1, description="Field passed to the reward function as `answer`.")
    max_prompt_length: int = Field(32, ge=1, le=MAX_TOKENS,
                                   description="Prompt tokens; longer prompts are left-truncated. With "
                                               "rollout.maxNewTokens, within the model's context.")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH,
                            description="Prompts per step (data files must hold at least this many).")
    shuffle: bool = Field(True)
    eval: EvalSpec | None = Field(None, description="Held-out evaluation with greedy decoding (off when unset).")

    @field_validator("files")
    @classmethod
    def _known_formats(cls, files: list[str]) -> list[str]:
        return _check_formats(files)

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if self.task and self.files:
            raise ValueError("give either task or files, not both")
        if not self.task and not self.files:
            raise ValueError(f"give a built-in task ({', '.join(BUILTIN_TASKS)}) or a list of files")
        return self


class OverlongSpec(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025): a response longer than rollout.maxNewTokens - buffer loses
    penalty x (its tokens past that) / buffer from its reward, so one cut at maxNewTokens loses the whole penalty."""

    buffer: int = Field(ge=1, le=MAX_TOKENS, description="Tokens before rollout.maxNewTokens where the penalty "
                                                         "starts; below maxNewTokens.")
    penalty: float = Field(1.0, ge=0, le=1e6, description="The penalty at maxNewTokens, in reward units.")


class RewardSpec(Section):
    function: str | None = Field(
        None, json_schema_extra=name_or_path_schema(REWARD_FUNCTION_NAMES),
        description="Rule reward: a built-in (repeat-letter, gsm8k; environment: 0, the reward is spec.environment's "
                    "alone) or an import path `package.module:function`, returning a float in [0, 1].",
    )
    model: ModelSource | None = Field(None, description="Reward model with a sequence-classification head.")
    overlong: OverlongSpec | None = Field(None, description="Shape the reward of responses near the length limit "
                                                            "(DAPO); off by default.")

    _function = field_validator("function")(named_or_path(REWARD_FUNCTION_NAMES))

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        has_model = self.model is not None and self.model.is_set()
        if bool(self.function) == has_model:
            raise ValueError("give exactly one of function (import path) or model")
        return self


MAX_STALENESS = 64  # batches queued ahead at the rollout role: each is a batch of prompts held and generated


class AsyncRolloutSpec(Section):
    """Fully asynchronous rollout (spec.rollout.async): a rollout role of its own generates continuously."""

    max_staleness: int = Field(
        1, ge=1, le=MAX_STALENESS,
        description="The most policy versions (trained steps) a sample's oldest token may lag the trainer's; older "
                    "samples are dropped and counted. It also bounds the rollout queue: this many batches ahead.")
    partial: Literal["continue", "finish"] = Field(
        "finish", description="A generation in flight when new weights arrive: finish it under the old weights, or "
                              "continue it under the new ones from the next token (the version of every token is "
                              "recorded either way).")


class RolloutSpec(Section):
    engine: Literal["hf", "vllm"] = Field("hf", description="hf (transformers generate) or vllm.")
    max_new_tokens: int = Field(16, ge=1, le=MAX_TOKENS,
                                description="Response length limit, in tokens; with data.maxPromptLength, within "
                                            "the model's context (its max_position_embeddings).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    n: int | None = Field(None, ge=1, le=MAX_GROUP, description="Samples per prompt; defaults to algorithm.groupSize.")
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_GPUS,
                                      description="vLLM tensor-parallel size; must divide actor GPUs.")
    gpu_memory_utilization: float = Field(0.4, gt=0, le=1, description="vLLM KV-cache share of GPU memory.")
    fixed_length: bool = Field(False, description="Ignore EOS and always emit maxNewTokens (benchmarks).")
    compile: bool = Field(False, description="hf on CUDA: static KV cache + CUDA graphs via torch.compile.")
    sleep_mode: bool = Field(True, description="vllm: release the engine's KV cache and weights after each "
                             "rollout until the next weight sync, so the actor trains in that GPU memory.")
    asynchronous: bool = Field(
        False, description="One-step-off rollout: while step k's updates run, the actor generates step k+1's batch "
        "with the weights that generated step k's (so every batch after the first is one update stale); the "
        "policy loss weighs it by the importance ratio to those behaviour log-probs, and the weights are synced "
        "after both the update and that rollout are done. Needs engine hf.")
    async_: AsyncRolloutSpec | None = Field(
        None, alias="async",
        description="Fully asynchronous rollout: workers of spec.roles.rollout generate continuously into a bounded "
                    "queue with the weights the actor pushes after each update, and the trainer takes batches at "
                    "most maxStaleness versions behind. Needs engine hf; not with asynchronous (one-step-off).")

    @model_validator(mode="after")
    def _async_engine(self) -> RolloutSpec:
        if self.asynchronous and self.engine != "hf":
            raise ValueError("asynchronous needs engine hf (its behaviour log-probs come from the engine's model)")
        return self

    @property
    def off_policy(self) -> bool:
        """Whether batches are generated by weights older than the trained ones (asynchronous or async)."""
        return self.asynchronous or self.async_ is not None


ENVIRONMENT_BUILTINS: tuple[str, ...] = ("tools", "code_tools")  # spec.environment.module names, not user modules
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")  # an importable module: my_env, package.my_env
CLASS_NAME = re.compile(r"^[A-Za-z_]\w*$")
MAX_TURNS = 256  # policy turns per trajectory
MAX_ENV_CONCURRENCY = 4096  # trajectories whose environments step at once


class EnvironmentSpec(Section):
    """Agentic RL (multi-turn rollout, `kuberl.rollout.multiturn`): the environment the policy acts in, turn after
    turn, on the actor's ranks (docs/user-guide.md, Environments)."""

    module: str = Field(
        ..., min_length=1, max_length=253, json_schema_extra={"pattern": MODULE_NAME.pattern},
        description="The module holding the environment class, importable as a reward module is (a file beside the "
                    "manifest: my_env for my_env.py, or an installed package.module); or tools, the built-in "
                    "tool-calling environment (JSON function calls, a calculator), or code_tools (tools and a "
                    "python tool that runs the policy's code in a sandbox).")
    class_: str | None = Field(
        None, alias="class", max_length=253, json_schema_extra={"pattern": CLASS_NAME.pattern},
        description="The environment class in module, with reset(row) and step(action_text) (kuberl.envs); required "
                    "for a module of one's own, unset for a built-in.")
    max_turns: int = Field(4, ge=1, le=MAX_TURNS, description="Policy turns per trajectory at most; a trajectory "
                                                              "also ends when the environment says done.")
    max_tokens_per_turn: int = Field(
        64, ge=1, le=MAX_TOKENS,
        description="Tokens one policy turn may generate (a turn ends at EOS or here). maxTurns x maxTokensPerTurn "
                    "must fit in rollout.maxNewTokens, which holds the whole trajectory after the prompt: the "
                    "policy's turns and the observations between them.")
    timeout_seconds: float = Field(30.0, gt=0, le=MAX_SECONDS,
                                   description="One reset or step call slower than this fails its trajectory.")
    concurrency: int = Field(16, ge=1, le=MAX_ENV_CONCURRENCY,
                             description="Trajectories whose environment calls run at once, per environment "
                                         "replica.")

    @property
    def builtin(self) -> bool:
        """Whether module names a built-in environment (tools, code_tools) rather than a user module."""
        return self.module in ENVIRONMENT_BUILTINS

    @property
    def where(self) -> str:
        """The environment's name in error lines: module.Class, or the built-in's module name."""
        return self.module + (f".{self.class_}" if self.class_ else "")


class CheckpointSpec(Section):
    path: str | None = Field(None, description="Directory for checkpoints; defaults to <out>/checkpoints "
                                               "(on Kubernetes: /checkpoints).")
    volume_claim: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, max_length=253,
        description="Kubernetes: a ReadWriteMany PersistentVolumeClaim mounted at the checkpoint path in the driver "
                    "and every worker pod. "
                    "Unset: checkpoints are written inside the pods and do not survive a pod restart.",
    )
    interval: int = Field(10, ge=1, le=MAX_STEPS, description="Steps between checkpoints.")
    keep: int = Field(2, ge=1, le=1000, description="Checkpoints kept on disk.")


class MetricsSpec(Section):
    prometheus_port: int | None = Field(None, ge=0, le=65535, description="Serve /metrics on this port (0 = any).")
    prometheus_address: str = Field("127.0.0.1", description="Bind address for /metrics.")


class MLflowSpec(Section):
    tracking_uri: str | None = Field(None,
                                     description="MLflow tracking URI; default: MLflow's own (MLFLOW_TRACKING_URI).")
    experiment: str | None = Field(None, min_length=1, description="Experiment name; default: the job's name.")


class WandbSpec(Section):
    project: str = Field(..., min_length=1, description="W&B project.")
    entity: str | None = Field(None, min_length=1, description="W&B entity (user or team).")
    mode: Literal["online", "offline"] = Field("online",
                                               description="offline writes runs under <out>/wandb for `wandb sync`.")


class SecretKey(Section):
    """One key of a Secret in the job's namespace."""

    name: str = Field(..., max_length=253, pattern=DNS_SUBDOMAIN, description="The Secret's name.")
    key: str = Field(..., min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Its key.")


# Each credential, the environment variable its library reads, and whether the Ray pods need it too (the hub
# token: they load the models) or the driver alone (tracking: the driver logs)
CREDENTIALS = {"hugging_face": ("HF_TOKEN", True), "wandb": ("WANDB_API_KEY", False),
               "mlflow": ("MLFLOW_TRACKING_TOKEN", False)}


class CredentialsSpec(Section):
    """Kubernetes: tokens for the hub and the trackers, as references to Secrets of the job's namespace, never
    values. Each becomes an environment variable (valueFrom.secretKeyRef) of the pods that use it, so it appears
    in no manifest, status or log. A run on this machine takes the same variables from its environment."""

    hugging_face: SecretKey | None = Field(None, description="HF_TOKEN, for a private or gated spec.model.hub, in "
                                                             "the driver and every Ray pod.")
    wandb: SecretKey | None = Field(None, description="WANDB_API_KEY (spec.tracking.wandb), in the driver.")
    mlflow: SecretKey | None = Field(None, description="MLFLOW_TRACKING_TOKEN (spec.tracking.mlflow), in the driver.")

    def env(self, driver: bool) -> list[dict[str, Any]]:
        """The env entries of a pod: the driver's (``driver``), or a Ray pod's (the hub token only)."""
        return [{"name": var, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
                for attr, (var, ray) in CREDENTIALS.items()
                if (ref := getattr(self, attr)) is not None and (driver or ray)]

    def secrets(self) -> list[str]:
        """The Secrets named (the job policy's allowedCredentialSecrets bounds them)."""
        return [ref.name for attr in CREDENTIALS if (ref := getattr(self, attr)) is not None]


class TrackingSpec(Section):
    """Experiment tracking: every scalar of metrics.jsonl, per step."""

    tensorboard: bool = Field(True, description="TensorBoard event files under <out>/tensorboard.")
    mlflow: MLflowSpec | None = Field(None, description="Log to MLflow (needs the mlflow package).")
    wandb: WandbSpec | None = Field(None, description="Log to Weights & Biases (needs the wandb package).")


def _deprecated(*new: str) -> str:
    """The description of a spec.trainer field that a role's optim block replaces (accepted for one version)."""
    both = len(new) > 1
    return (f"Deprecated, accepted for one more version: write {' and '.join(new)}. When set, it fills "
            f"{'those fields' if both else 'that field'}; read back, it is the value in effect"
            f"{' (null where they differ)' if both else ''}.")


class TrainerSpec(Section):
    steps: int = Field(60, ge=1, le=MAX_STEPS, description="Training steps (one rollout batch each).")
    ppo_epochs: int = Field(1, ge=1, le=1000, description="Passes over each rollout batch.")
    mini_batch_size: int = Field(16, ge=1, le=MAX_SAMPLES, description="Samples per optimizer step.")
    micro_batch_size: int = Field(8, ge=1, le=MAX_SAMPLES,
                                  description="Samples per forward/backward on one rank (gradient accumulation); "
                                              "under maxTokensPerMicroBatch only the reward model's batches.")
    packing: bool = Field(False, description="Pack each micro-batch's sequences into one row of real tokens, with "
                                             "their own position ids and attention kept inside each (varlen): no pad "
                                             "token in the ref's, the critic's or the updates' matmuls. On whenever "
                                             "maxTokensPerMicroBatch is set.")
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, le=MAX_TOKENS * 64,
        description="Cut micro-batches by tokens instead of samples: each takes rows whose prompt + response tokens "
                    "sum to at most this, always packed (whatever packing says). At least data.maxPromptLength + "
                    "rollout.maxNewTokens.")
    actor_lr: float | None = Field(None, gt=0, description=_deprecated("spec.roles.actor.optim.lr"))
    critic_lr: float | None = Field(None, gt=0, description=_deprecated("spec.roles.critic.optim.lr"))
    weight_decay: float | None = Field(None, ge=0, description=_deprecated("spec.roles.actor.optim.weightDecay",
                                                                          "spec.roles.critic.optim.weightDecay"))
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int | None = Field(None, ge=0, le=MAX_STEPS,
                                     description=_deprecated("spec.roles.actor.optim.warmupSteps",
                                                             "spec.roles.critic.optim.warmupSteps"))
    seed: int = Field(0, ge=0, le=2**32 - 1,
                      description="Seed of the data order, sampling and built-in models' weights (numpy's range, "
                                  "which vLLM seeds).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)

    @property
    def packed(self) -> bool:
        """Whether training roles pack their sequences (packing, or a token budget per micro-batch)."""
        return self.packing or self.max_tokens_per_micro_batch is not None


class Resources(Section):
    cpu: Quantity = Field("1", description="CPU cores per replica: a Kubernetes quantity, e.g. 2, 500m, 1e3.")
    memory: Quantity = Field("4Gi", description="Memory per replica in bytes: a Kubernetes quantity, e.g. 512Mi, 4Gi.")

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str, info) -> str:
        value = parse_quantity(v)
        if value <= 0:
            raise ValueError(f"{v!r} must be more than 0")
        if value > INT64_MAX:
            raise ValueError(f"{v!r} is more than the largest Kubernetes quantity, 2^63-1")
        if info.field_name == "memory" and value < 1:
            raise ValueError(f"{v!r} is {value.normalize():f} bytes (m is milli): for mebibytes write Mi (512Mi)")
        return v

    def cpu_cores(self) -> float:
        """CPU as a number of cores, as Kubernetes reads the quantity ("500m", ".5" -> 0.5; "1e3" -> 1000.0)."""
        return float(parse_quantity(self.cpu))


class OffloadSpec(Section):
    """FSDP2 CPU offload for a training role (actor, critic): what lives in host memory between uses."""

    params: bool = Field(False, description="Parameters and gradients on the CPU, brought to the GPU per FSDP unit "
                                            "(FSDP2 CPUOffloadPolicy); AdamW then steps on the CPU, so it needs "
                                            "optimizer: true as well.")
    optimizer: bool = Field(False, description="AdamW state (exp_avg, exp_avg_sq) in pinned CPU memory; alone, the "
                                               "step streams it through the GPU a chunk at a time.")
    reshard_after_forward: bool | None = Field(
        None, description="Free each unit's gathered parameters after forward (gathered again in backward): less "
                          "memory, more traffic. Default: true, except one GPU without params offload.")

    @property
    def any(self) -> bool:
        return self.params or self.optimizer or self.reshard_after_forward is not None


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSpec(Section):
    """LoRA adapters for a training role (actor, critic): the base model frozen, only adapters train."""

    rank: int = Field(0, ge=0, le=1024, description="Adapter rank r; 0 = no LoRA (full fine-tuning).")
    alpha: float = Field(16.0, gt=0, description="Scaling numerator: the update is (alpha / rank) B A x.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[Literal[LORA_TARGETS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="Linear layers (by name in each block) that get adapters.")
    train_modules: list[str] = Field(
        default_factory=list, description="Modules trained in full beside the adapters, by the end of their name "
                                          "(e.g. norm: every RMSNorm); the actor then cannot stand in for ref.")
    bias: Literal["none", "lora_only", "all"] = Field(
        "none", description="Biases that train beside the adapters, as PEFT's bias: none, those of the adapted layers "
                            "(lora_only) or every bias (all); with biases training the actor cannot stand in for ref.")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def base_frozen(self) -> bool:
        """Whether the base model stays as loaded (only adapters train), so it is the reference policy."""
        return not self.train_modules and self.bias == "none"


class RoleSpec(Scheduling):
    """One role: its size and resources, and (on Kubernetes) where its pods may run (Scheduling)."""

    enabled: bool = Field(True, description="Run this role (critic is always off for GRPO).")
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS,
                          description="Data-parallel replicas (Ray actors / pods); 0 = the role does not run (ref and "
                                      "extra roles only).")
    gpus: int = Field(0, ge=0, le=MAX_GPUS, description="GPUs per replica (0 = CPU).")
    resources: Resources = Field(default_factory=Resources)
    max_restarts: int = Field(3, ge=0, le=1000, description="Restarts of this role before the job fails.")
    offload: OffloadSpec = Field(default_factory=OffloadSpec,
                                 description="CPU offload of a training role's FSDP2 state (actor, critic only).")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters (actor, critic only).")
    colocate_with: str | None = Field(
        None, pattern=ROLE_NAME.pattern,
        description="Run this role's ranks on the same GPUs (on Kubernetes: in the same pods) as the named role's "
                    "ranks, each role still its own process with its own restarts; each of the k roles sharing a GPU "
                    "asks Ray for 1/k of it. The host role must be enabled, must not be colocated itself, and must "
                    "have the same replicas and gpus (docs/user-guide.md, Colocation).")
    standby: bool | None = Field(
        None, description="This role's warm standby (spec.resilience.standby): true or false overrides the job's "
                          "setting for this role, e.g. none for a rule reward whose cold restart takes a second; "
                          "unset follows it.")
    idle_memory: Literal["offload", "free"] = Field(
        "offload", description="A role that shares its GPUs (colocateWith, on either side), between its phases: "
                               "offload moves its weights, optimizer state and hf rollout model to host memory and "
                               "back before its next phase, and frees the allocator's cache; free only frees the "
                               "cache (activations, temporaries), the weights stay on the GPU.")

    @property
    def world_size(self) -> int:
        """Ranks of the role: one per GPU (replicas x GPUs per replica), or one per replica on CPU."""
        return self.replicas * max(self.gpus, 1)


ADAMW_BETAS = (0.9, 0.95)
OPTIM_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "betas": list(ADAMW_BETAS), "weight_decay": 0.0, "warmup_steps": 0}
"""What a training role's optimizer uses for a field that neither its optim block nor a deprecated alias sets."""
OPTIM_ALIASES: dict[str, tuple[tuple[str, ...], str]] = {
    "actor_lr": (("actor",), "lr"), "critic_lr": (("critic",), "lr"),
    "weight_decay": (TRAINING_ROLES, "weight_decay"), "warmup_steps": (TRAINING_ROLES, "warmup_steps")}
"""Each deprecated field of spec.trainer: the roles whose optim field it stands for, and that field."""


class OptimSpec(Section):
    """A training role's optimizer (AdamW) and its learning-rate warm-up, as the manifest gives it. A field left
    out takes its deprecated spec.trainer alias when that is set, else its default: JobSpec.optim(role) is the
    block in effect."""

    lr: float | None = Field(None, gt=0, description="Learning rate, reached at the end of the warm-up. Default "
                                                    "0.001.")
    betas: list[Annotated[float, Field(ge=0, lt=1)]] | None = Field(
        None, min_length=2, max_length=2,
        description="AdamW's beta1 and beta2: the decay of its running averages of the gradient and of its square. "
                    f"Default {list(ADAMW_BETAS)}.")
    weight_decay: float | None = Field(None, ge=0, description="AdamW's decoupled weight decay. Default 0.")
    warmup_steps: int | None = Field(
        None, ge=0, le=MAX_STEPS,
        description="Linear warm-up: step s (from 0) trains at lr x min(1, (s + 1) / (warmupSteps + 1)). Default 0.")


class TrainingRoleSpec(RoleSpec):
    """A role that trains (actor, critic): its size and resources, where its pods may run, and its optimizer."""

    optim: OptimSpec | None = Field(None, description="The role's optimizer: learning rate, AdamW's betas and "
                                                      "weight decay, warm-up.")


# An extra role's config is free-form JSON, which every watcher of RLTrainingJobs parses: a deep one would make a
# parser recurse until it fails (Python's json at about 1000 levels). The API server cannot bound a free-form
# field's depth in the CRD (its CEL sees no unknown fields), so the chart's job policy does, with these numbers.
CONFIG_MAX_KEYS, CONFIG_MAX_DEPTH, EXTRA_MAX_ROLES = 64, 8, 16


def nesting(value: Any) -> int:
    """How deep maps and lists nest in ``value``: 0 for a scalar, 1 for a map or list of scalars (or an empty
    one). Level by level, so a deep value cannot exhaust the stack here; it stops one past CONFIG_MAX_DEPTH."""
    depth, level = 0, [value]
    while depth <= CONFIG_MAX_DEPTH:
        containers = [v for v in level if isinstance(v, (dict, list))]
        if not containers:
            break
        depth += 1
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]
    return depth


class ExtraRoleSpec(RoleSpec):
    """A role of one's own: a worker class, run like the built-in roles (its own WorkerGroup, placement
    group, restarts and status; on Kubernetes its own worker group) and called from a program."""

    worker: str = Field(..., json_schema_extra={"pattern": IMPORT_PATH.pattern},
                        description="Import path package.module:Class of the worker class (a kuberl.workers.Worker).")
    config: dict[str, Any] = Field(default_factory=dict,
                                   json_schema_extra={"x-kubernetes-preserve-unknown-fields": True,
                                                      "maxProperties": CONFIG_MAX_KEYS},
                                   description=f"Settings for the worker, as it defines them (self.role_spec.config): "
                                               f"at most {CONFIG_MAX_KEYS} keys, values nested at most "
                                               f"{CONFIG_MAX_DEPTH} deep.")

    @field_validator("config")
    @classmethod
    def _bounded(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) > CONFIG_MAX_KEYS:
            raise ValueError(f"has {len(v)} keys, more than {CONFIG_MAX_KEYS}")
        if (depth := nesting(v)) > CONFIG_MAX_DEPTH:
            raise ValueError(f"is nested {depth} deep, more than {CONFIG_MAX_DEPTH}: flatten it, or give the worker "
                             f"a file to read")
        return v

    @field_validator("worker")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if not IMPORT_PATH.match(v):
            raise ValueError(f"{v!r} is not an import path of the form package.module:Class")
        return v


class RolesSpec(Section):
    actor: TrainingRoleSpec = Field(default_factory=TrainingRoleSpec)
    critic: TrainingRoleSpec = Field(default_factory=TrainingRoleSpec)
    ref: RoleSpec = Field(default_factory=RoleSpec)
    reward: RoleSpec = Field(default_factory=RoleSpec)
    rollout: RoleSpec = Field(default_factory=RoleSpec,
                              description="The rollout workers of spec.rollout.async (runs only with it).")
    env: RoleSpec = Field(default_factory=RoleSpec,
                          description="The environment workers of spec.environment (runs only with it): CPU processes "
                                      "(on Kubernetes, pods) that hold the environments and answer the actor's reset "
                                      "and step calls, each replica up to spec.environment.concurrency at once; "
                                      "restarted alone when one dies. enabled: false runs the environments in the "
                                      "actor's own processes instead.")
    extra: dict[str, ExtraRoleSpec] = Field(
        default_factory=dict, json_schema_extra={"maxProperties": EXTRA_MAX_ROLES},
        description=f"Roles of one's own, by name (lowercase letters, digits, '-'; at most 20), at most "
                    f"{EXTRA_MAX_ROLES}.")

    @field_validator("extra")
    @classmethod
    def _names(cls, extra: dict[str, ExtraRoleSpec]) -> dict[str, ExtraRoleSpec]:
        for name in extra:
            if name in ROLES:
                raise ValueError(f"{name!r} is a built-in role: configure it as spec.roles.{name}")
            if not ROLE_NAME.match(name):
                raise ValueError(f"role name {name!r} must be lowercase letters, digits and '-', at most 20 characters")
        return extra

    def path(self, role: str) -> str:
        """A role's field path under spec: roles.<role>, or roles.extra.<role> for an extra role."""
        return f"roles.{role}" if role in ROLES else f"roles.extra.{role}"

    def get(self, role: str) -> RoleSpec:
        """A role's spec by name: a built-in role or an extra one."""
        if role in ROLES:
            return getattr(self, role)
        if role in self.extra:
            return self.extra[role]
        raise KeyError(f"no role {role!r} in spec.roles")


class FaultSpec(Section):
    """Fault injection for demos and tests: kill ROLE's worker process at STEP."""

    role: str = Field(..., min_length=1, description="A role of the job (built-in or extra).")
    step: int = Field(..., ge=1, le=MAX_STEPS)


class ResilienceSpec(Section):
    call_timeout_seconds: float = Field(600.0, gt=0, le=MAX_SECONDS,
                                        description="A worker call slower than this counts as hung.")
    start_timeout_seconds: float = Field(
        1800.0, gt=0, le=MAX_SECONDS,
        description="How long a role's group may wait for capacity and start (pods scheduled, image pulled, models "
                    "built)."
    )
    restart_timeout_seconds: float | None = Field(
        None, gt=0, le=MAX_SECONDS,
        description="On Kubernetes, how long the job may stay in phase Restarting (a role's or the Ray head's pods "
                    "replaced and not all ready again) before it fails with reason RestartTimedOut. Default: "
                    "startTimeoutSeconds + 600, the time the new pods may take to start, which the driver bounds "
                    "itself, and 10 minutes to load and restore the role's state.")
    faults: list[FaultSpec] = Field(default_factory=list, max_length=64, description="Injected faults (testing/demo).")
    standby: bool = Field(
        False, description="Keep a warm standby per role (a process started in advance; on Kubernetes a Running "
                           "pod), which takes a failed role's place at once while a new standby starts.")
    snapshots: Literal["auto", "on", "off"] = Field(
        "auto", description="Per-step snapshots of actor and critic, so that a restart loses no completed step "
                            "(a copy of each rank's state after every update, to host memory for a role with GPUs, "
                            "beside the next step's first phases). auto: on, but for roles that share their GPUs "
                            "(colocateWith), whose copies would be on the training path; docs/operations.md.")

    def restart_deadline_seconds(self) -> float:
        """Seconds a job may stay in phase Restarting (restartTimeoutSeconds, else startTimeoutSeconds + 600)."""
        return self.restart_timeout_seconds or self.start_timeout_seconds + RESTART_RESTORE_SECONDS


class PlacementSpec(Section):
    """GPU placement with respect to PCIe/NVLink topology (docs/placement.md)."""

    policy: Literal["preferred", "required"] = Field(
        "preferred",
        description="required: a role whose GPU groups cannot meet minLink is not started (PlacementDegraded).",
    )
    min_link: Literal["NV", "PIX", "PXB", "PHB", "NODE", "SYS"] = Field(
        "SYS", description="Worst acceptable link inside a GPU group: NV > PIX > PXB > PHB > NODE > SYS."
    )
    mode: Literal["device-plugin", "dra"] = Field(
        "device-plugin",
        description="device-plugin: nvidia.com/gpu limits; dra: a ResourceClaimTemplate per role (resource.k8s.io/v1).",
    )
    dra_constraint: Literal["pcieRoot", "numaNode"] = Field(
        "pcieRoot", description="dra: keep each replica's GPUs on one PCIe root or one NUMA node (matchAttribute)."
    )
    device_class: str = Field("gpu.nvidia.com", min_length=1, max_length=253, pattern=DNS_SUBDOMAIN,
                              description="dra: DeviceClass of the GPUs.")


class JobSpec(Section):
    model: ModelSpec = Field(default_factory=ModelSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    data: DataSpec
    reward: RewardSpec
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    environment: EnvironmentSpec | None = Field(
        None, description="Multi-turn rollout in an environment (agentic RL): the policy's turns, each answered by the "
                          "environment's observation, up to a reward. Off when unset (single-turn: prompt, response, "
                          "reward). A trajectory's reward is spec.reward's score of the policy's own words plus the "
                          "environment's rewards.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    roles: RolesSpec = Field(default_factory=RolesSpec)
    resilience: ResilienceSpec = Field(default_factory=ResilienceSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    credentials: CredentialsSpec = Field(default_factory=CredentialsSpec)
    image: str | None = Field(
        None, min_length=1,
        description="Kubernetes: runtime image of the Ray pods and the driver; defaults to the operator's --image.",
    )
    suspend: bool = Field(False, description="Stop the job's pods and keep its state; false resumes.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=int(MAX_DEADLINE_SECONDS),
        description="Kubernetes: how long the job may be active (Provisioning, Running or Restarting), counted from "
                    "status.startTime (its start, or its last resume), before it fails with reason DeadlineExceeded "
                    "and its pods are stopped; as a batch Job's. Unset: no bound.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=int(MAX_DEADLINE_SECONDS),
        description="Kubernetes: delete the job, and everything it owns, this long after it succeeded or failed "
                    "(status.completionTime); as a batch Job's. Unset: kept until deleted.",
    )
    managed_by: str | None = Field(
        None, min_length=1, max_length=63, pattern=MANAGED_BY_PATTERN,
        json_schema_extra={"x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                         "message": "spec.managedBy is immutable"}]},
        description=f"Kubernetes: the controller that reconciles this job. Unset or {MANAGED_BY_KUBERL!r}: kuberl's "
                    "operator; any other value (kueue.x-k8s.io/multikueue, for one) and the operator leaves the job "
                    "alone: it makes nothing and writes no status. Immutable.",
    )

    def standby(self, role: str) -> bool:
        """Whether `role` keeps a warm standby: its own roles.<role>.standby, else spec.resilience.standby."""
        own = self.roles.get(role).standby
        return self.resilience.standby if own is None else own

    @property
    def tis_enabled(self) -> bool:
        """Whether the policy loss is corrected by truncated importance sampling (spec.algorithm.tis)."""
        return self.algorithm.tis == "on" or (self.algorithm.tis == "auto" and self.rollout.off_policy)

    @property
    def samples_per_prompt(self) -> int:
        if self.rollout.n is not None:
            return self.rollout.n
        return self.algorithm.group_size if self.algorithm.name != "ppo" else 1

    @property
    def samples_per_step(self) -> int:
        return self.data.batch_size * self.samples_per_prompt

    @model_validator(mode="after")
    def _cross_field(self) -> JobSpec:
        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldError(problems)
        write_back_aliases(self)
        return self

    def optim(self, role: str) -> OptimSpec:
        """A training role's optimizer in effect: each field from spec.roles.<role>.optim, else from its deprecated
        spec.trainer alias, else OPTIM_DEFAULTS."""
        own = self.roles.get(role).optim or OptimSpec()
        aliases = {new: getattr(self.trainer, old) for old, (roles, new) in OPTIM_ALIASES.items() if role in roles}
        return OptimSpec(**{name: next(v for v in (getattr(own, name), aliases.get(name), copy.copy(default))
                                       if v is not None)
                            for name, default in OPTIM_DEFAULTS.items()})


class ObjectMeta(BaseModel):
    """Kubernetes' ObjectMeta, field by field: what a manifest sets (name, namespace, labels, annotations) and what
    the API server adds to a live object (uid, resourceVersion, managedFields, ...), which the operator validates.
    Any other key is a typo (``nmae``) and refused, instead of the job silently becoming ``job``."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)
    name: str = Field("job", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=53,
                      description="The job's name (default job); it names the output folder and the job's pods.")
    namespace: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    labels: dict[str, str] | None = None  # null as Kubernetes takes it: none
    annotations: dict[str, str] | None = None
    # set by the API server on a live object (or by kubectl), read by no one here: typed, so a bad one is refused
    generate_name: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = Field(None, ge=0, le=INT64_MAX)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = Field(None, ge=0, le=INT64_MAX)
    owner_references: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return v if v is None else check_labels(v)

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key in v or {}:
            if (problem := label_key_problem(key)) is not None:
                raise ValueError(problem.replace("label key", "annotation key", 1))
        return v


class RLTrainingJob(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    api_version: Literal["kuberl.io/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["RLTrainingJob"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: JobSpec
    status: dict | None = None


class CrossFieldError(ValueError):
    """Raised by JobSpec with (field path, message, fix) triples relative to `spec`."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        super().__init__("; ".join(f"{f}: {m}" for f, m, _ in problems))
        self.problems = problems


def enabled_roles(spec: JobSpec) -> list[str]:
    """Roles that run for this spec, built-in ones first, then extra ones: the critic runs for ppo only, the rollout
    role with spec.rollout.async only, the env role with spec.environment only;
    a role can be disabled with `enabled: false` or `replicas: 0` (actor and reward cannot be)."""
    roles = []
    for role in (*ROLES, *spec.roles.extra):
        if not spec.roles.get(role).enabled or spec.roles.get(role).replicas == 0:
            continue
        if role == "critic" and spec.algorithm.name != "ppo":
            continue
        if role == "rollout" and spec.rollout.async_ is None:
            continue
        if role == "env" and spec.environment is None:
            continue
        roles.append(role)
    return roles


Problem = tuple[str, str, str]
"""A cross-field problem: (field path under spec, message, fix)."""


def cross_field_problems(spec: JobSpec) -> list[Problem]:
    """Rules that span sections, one function per section, in a fixed order. Returns (field path under spec,
    message, fix) triples."""
    rules = (_algorithm_problems, _tis_problems, _tensor_parallel_problems, _eval_problems, _engine_problems,
             _batch_problems, memory_problems, colocation_problems, _builtin_context_problems, _estimator_problems,
             needed_role_problems, _role_enabled_problems, _placement_problems, _checkpoint_problems,
             _fault_problems, _optim_alias_problems, _environment_problems)
    return [problem for rule in rules for problem in rule(spec)]


def _tis_problems(spec: JobSpec) -> list[Problem]:
    """spec.algorithm.tis: on under rollout.async, whose only correction it is; temperature 1 with vLLM."""
    out = []
    if spec.algorithm.tis == "off" and spec.rollout.async_ is not None:
        out.append(("algorithm.tis", "is off, but rollout.async needs it: its old log-probs are the trained "
                                     "policy's, so only TIS weighs each token by the policy that drew it, up to "
                                     "maxStaleness updates older",
                    "set spec.algorithm.tis: auto or on, or remove spec.rollout.async"))
    if spec.tis_enabled and spec.rollout.engine == "vllm" and spec.rollout.temperature != 1.0:
        out.append(("algorithm.tis", "needs rollout.temperature 1 with engine vllm (vLLM's log-probs are the raw "
                                     "logits', at temperature 1)", "set spec.algorithm.tis: off, or temperature 1"))
    return out


def _algorithm_problems(spec: JobSpec) -> list[Problem]:
    """spec.algorithm: grpo's group size, rollout.n against it, the adaptive KL controller's target, dynamic
    sampling's needs; the overlong reward's buffer against the length limit."""
    algo, out = spec.algorithm, []
    if algo.name == "grpo" and algo.group_size < 2:
        out.append(("algorithm.groupSize", "must be >= 2 for grpo",
                    "set spec.algorithm.groupSize to 2 or more, e.g. 4"))
    n = spec.rollout.n
    if algo.name != "ppo" and n is not None and n != algo.group_size:
        out.append(("rollout.n", f"must equal algorithm.groupSize ({algo.group_size}) for {algo.name}",
                    "remove spec.rollout.n or set it to spec.algorithm.groupSize"))
    if algo.kl.controller == "adaptive" and algo.kl.target is None:
        out.append(("algorithm.kl.target", "is required when controller is adaptive",
                    "set spec.algorithm.kl.target, e.g. 0.1"))
    if algo.dynamic_sampling is not None and spec.samples_per_prompt < 2:
        out.append(("algorithm.dynamicSampling", "needs several responses per prompt to compare",
                    "set spec.algorithm.groupSize (ppo: spec.rollout.n) to 2 or more, or remove dynamicSampling"))
    if algo.dynamic_sampling is not None and spec.rollout.engine == "vllm" and spec.rollout.sleep_mode:
        out.append(("algorithm.dynamicSampling", "needs rollout.sleepMode false with engine vllm (a refill "
                                                 "generates again before the weight sync that wakes the engine)",
                    "set spec.rollout.sleepMode: false, or remove dynamicSampling"))
    if algo.dynamic_sampling is not None and spec.rollout.off_policy:
        mode = "rollout.asynchronous" if spec.rollout.asynchronous else "rollout.async"
        out.append(("algorithm.dynamicSampling", f"is not supported with {mode} (a refill would mix the batch's "
                                                 "staleness)",
                    f"remove spec.algorithm.dynamicSampling, or spec.{mode}"))
    overlong, limit = spec.reward.overlong, spec.rollout.max_new_tokens
    if overlong is not None and spec.rollout.fixed_length:
        out.append(("reward.overlong", "penalises every response of rollout.fixedLength alike (each is maxNewTokens "
                                       "long)", "remove spec.reward.overlong, or rollout.fixedLength"))
    if overlong is not None and overlong.buffer >= limit:
        out.append(("reward.overlong.buffer", f"must be below rollout.maxNewTokens ({limit})",
                    f"set spec.reward.overlong.buffer to a part of it, e.g. {max(1, limit // 4)}"))
    return out


def _environment_problems(spec: JobSpec) -> list[Problem]:
    """spec.environment: a module name (or tools), the class a user module needs, and the token budget: the policy's
    turns at their longest fit in rollout.maxNewTokens, which also holds the observations between them."""
    env = spec.environment
    if env is None:
        return [("reward.function", "is environment (the environment's rewards alone), but spec.environment is unset",
                 "set spec.environment, or name another reward function")] if spec.reward.function == "environment" \
            else []
    out: list[Problem] = []
    builtins = ", ".join(ENVIRONMENT_BUILTINS)
    module_ok = MODULE_NAME.match(env.module) is not None and not env.module.endswith(".py")
    if not module_ok:
        hint = ("drop .py: name the module as Python imports it" if env.module.endswith(".py") else
                "put the class name in spec.environment.class" if ":" in env.module else
                "use dotted Python names only")
        out.append(("environment.module", f"{env.module!r} is not an importable module name ({hint})",
                    f"set spec.environment.module to a module name such as my_env (my_env.py beside the manifest) "
                    f"or package.my_env, or to {builtins}"))
    if env.class_ is not None and not CLASS_NAME.match(env.class_):
        out.append(("environment.class", f"{env.class_!r} is not a Python class name",
                    "set spec.environment.class to the name of the class alone, e.g. CalculatorEnv"))
    if env.builtin and env.class_ is not None:
        out.append(("environment.class", f"is set, but module {env.module} is the built-in {env.module} "
                                         "environment, which has no class to choose",
                    "remove spec.environment.class, or name your own module in spec.environment.module"))
    if not env.builtin and env.class_ is None and module_ok:
        out.append(("environment.class", f"is required: module {env.module} is a module of your own",
                    f"set spec.environment.class to the environment class in {env.module}, or set "
                    f"spec.environment.module to {builtins}"))
    if spec.rollout.async_ is not None:
        out.append(("environment", "is set with rollout.async, whose rollout role generates single-turn",
                    "remove spec.rollout.async (rollout.asynchronous, one step off, runs environments)"))
    if spec.data.eval is not None:
        out.append(("environment", "is set with data.eval, whose held-out answers are single-turn",
                    "remove spec.data.eval"))
    if spec.roles.env.gpus and "env" in enabled_roles(spec):
        out.append(("roles.env.gpus", f"is {spec.roles.env.gpus}, but the environment workers run on CPU (the policy "
                                      f"generates on the actor's GPUs)", "set spec.roles.env.gpus to 0, or remove it"))
    policy, room = env.max_turns * env.max_tokens_per_turn, spec.rollout.max_new_tokens
    if policy > room:
        most = room // env.max_turns
        lower = (f"set spec.environment.maxTokensPerTurn to at most {most}" if most else
                 f"set spec.environment.maxTurns to at most {room}")
        out.append(("environment.maxTokensPerTurn",
                    f"is {env.max_tokens_per_turn}: maxTurns x maxTokensPerTurn = {env.max_turns} x "
                    f"{env.max_tokens_per_turn} = {policy} tokens, more than rollout.maxNewTokens ({room}), which "
                    f"holds the whole trajectory after the prompt (the turns and the observations between them)",
                    f"set spec.rollout.maxNewTokens to at least {policy} plus room for the observations, or {lower}"))
    return out


def _tensor_parallel_problems(spec: JobSpec) -> list[Problem]:
    """spec.rollout.tensorParallelSize: one replica's GPUs split into whole tensor-parallel groups."""
    actor, tp = spec.roles.actor, spec.rollout.tensor_parallel_size
    if actor.gpus == 0 and tp > 1:
        return [("rollout.tensorParallelSize", "must be 1 when the actor has no GPUs",
                 "set spec.rollout.tensorParallelSize to 1 or give spec.roles.actor.gpus")]
    if actor.gpus > 0 and actor.gpus % tp:
        return [("rollout.tensorParallelSize",
                 f"must divide spec.roles.actor.gpus ({actor.gpus}): a tensor-parallel group is the GPUs of one "
                 f"replica, so the {actor.replicas} replicas x {actor.gpus} GPUs do not split into groups of {tp}",
                 f"set spec.rollout.tensorParallelSize to a divisor of {actor.gpus}, or spec.roles.actor.gpus "
                 f"to a multiple of {tp}")]
    return []


def _eval_problems(spec: JobSpec) -> list[Problem]:
    """spec.data.eval: held-out prompts to evaluate on."""
    ev, out = spec.data.eval, []
    if ev is not None and not (ev.task or ev.files or spec.data.task):
        out.append(("data.eval", "has no prompts: a built-in held-out split exists only for a built-in spec.data.task",
                    "give spec.data.eval.files (held-out prompts) or spec.data.eval.task"))
    return out


def _engine_problems(spec: JobSpec) -> list[Problem]:
    """spec.rollout.engine: vllm needs GPUs; one asynchronous mode at a time; rollout.async with hf and its role."""
    out = []
    if spec.rollout.engine == "vllm" and spec.roles.actor.gpus == 0:
        out.append(("rollout.engine", "vllm needs GPUs", "set spec.roles.actor.gpus >= 1 or use engine hf"))
    if spec.rollout.asynchronous and spec.rollout.async_ is not None:
        out.append(("rollout.async", "cannot be set together with rollout.asynchronous (the one-step-off mode)",
                    "remove spec.rollout.asynchronous, or spec.rollout.async"))
    if spec.rollout.async_ is not None and spec.rollout.engine != "hf":
        out.append(("rollout.async", "needs engine hf (its rollout workers hold an hf engine)",
                    "set spec.rollout.engine: hf, or remove spec.rollout.async"))
    rollout = spec.roles.rollout
    if spec.rollout.async_ is not None and (not rollout.enabled or rollout.replicas == 0):
        field = "roles.rollout.enabled" if not rollout.enabled else "roles.rollout.replicas"
        out.append((field, f"is {'false' if not rollout.enabled else 0}, but rollout.async needs the rollout role",
                    "set spec.roles.rollout.replicas to 1 or more (and enabled: true), or remove spec.rollout.async"))
    return out


def _batch_problems(spec: JobSpec) -> list[Problem]:
    """spec.trainer's batch sizes against the samples per step, and each running role's ranks against both."""
    tr, n = spec.trainer, spec.samples_per_step
    out: list[Problem] = []
    if n % tr.mini_batch_size:
        out.append(("trainer.miniBatchSize",
                    f"must divide the samples per step ({n} = data.batchSize x samples per prompt)",
                    f"set spec.trainer.miniBatchSize to a divisor of {n}"))
    budget, longest = tr.max_tokens_per_micro_batch, spec.data.max_prompt_length + spec.rollout.max_new_tokens
    if budget is not None and budget < longest:
        out.append(("trainer.maxTokensPerMicroBatch",
                    f"is {budget}, less than one sequence can be (data.maxPromptLength + rollout.maxNewTokens = "
                    f"{longest})", f"set spec.trainer.maxTokensPerMicroBatch to at least {longest}"))
    for role in enabled_roles(spec):
        if role != "env":  # it gets no share of a batch: the actor's trajectories go to its ranks in turn
            out += _rank_problems(spec, role)
    return out


def _rank_problems(spec: JobSpec, role: str) -> list[Problem]:
    """A running role's ranks divide the samples per step; a training role's, times the micro-batch, the
    mini-batch."""
    tr, n = spec.trainer, spec.samples_per_step
    rs, at = spec.roles.get(role), spec.roles.path(role)
    ranks, out = rs.world_size, []
    what = f"{ranks} ranks = spec.{at}.replicas x gpus" if rs.gpus else f"spec.{at}.replicas ({ranks})"
    if n % ranks:
        out.append((f"{at}.replicas", f"{what} must divide the samples per step ({n})",
                    f"choose replicas and gpus for {role} whose product divides {n}"))
    # under a token budget a rank's micro-batches are cut by tokens: its share of the mini-batch need only be whole
    micro = 1 if tr.max_tokens_per_micro_batch is not None else tr.micro_batch_size
    if role in ("actor", "critic") and tr.mini_batch_size % (ranks * micro):
        of = (f"ranks x trainer.microBatchSize ({ranks} x {micro})" if tr.max_tokens_per_micro_batch is None
              else f"ranks ({ranks})")
        out.append(("trainer.miniBatchSize", f"must be a multiple of the {role}'s {of}",
                    f"set spec.trainer.miniBatchSize to a multiple of {ranks * micro}"))
    return out


def _builtin_context_problems(spec: JobSpec) -> list[Problem]:
    """context_problems for the built-in models the job names (the policy's, the reward model's)."""
    return context_problems(spec, [(f"spec.{at}.builtin ({src.builtin})", BUILTIN_MAX_POSITIONS)
                                   for at, src in (("model", spec.model), ("reward.model", spec.reward.model))
                                   if src is not None and src.builtin])


def _estimator_problems(spec: JobSpec) -> list[Problem]:
    """spec.algorithm.advantageEstimator against the algorithm: group estimators need groups, gae the critic."""
    algo = spec.algorithm
    estimator, out = algo.estimator, []
    if algo.name == "reinforce" and estimator in ("grpo", "drgrpo", "rloo") and algo.group_size < 2:
        out.append(("algorithm.groupSize",
                    f"must be >= 2 for the {estimator} estimator (it compares samples of a group)",
                    "set spec.algorithm.groupSize to 2 or more, e.g. 4"))
    if estimator == "gae" and algo.name != "ppo":
        out.append(("algorithm.advantageEstimator", "gae needs the critic, which runs for algorithm ppo only",
                    "use algorithm.name ppo, or another estimator (grpo, drgrpo, rloo, reinforce++)"))
    elif algo.name == "ppo" and estimator in ADVANTAGE_ESTIMATOR_NAMES and estimator != "gae":
        out.append(("algorithm.advantageEstimator", f"{estimator} uses no critic, but algorithm ppo trains one",
                    f"use algorithm.name reinforce or grpo with advantageEstimator {estimator}, or gae"))
    return out


def _role_enabled_problems(spec: JobSpec) -> list[Problem]:
    """spec.roles.<role>.enabled: ppo needs the critic; the actor and the reward role always run."""
    roles, out = spec.roles, []
    if spec.algorithm.name == "ppo" and not roles.critic.enabled:
        out.append(("roles.critic.enabled", "ppo needs a critic",
                    "set spec.roles.critic.enabled to true or use algorithm grpo"))
    if not roles.actor.enabled:
        out.append(("roles.actor.enabled", "the actor cannot be disabled", "remove spec.roles.actor.enabled"))
    if not roles.reward.enabled:
        out.append(("roles.reward.enabled", "the reward role cannot be disabled", "remove spec.roles.reward.enabled"))
    return out


def _placement_problems(spec: JobSpec) -> list[Problem]:
    """spec.placement.mode: dra claims GPUs, so some role must have them."""
    if spec.placement.mode == "dra" and not any(spec.roles.get(r).gpus for r in enabled_roles(spec)):
        return [("placement.mode", "dra needs at least one role with GPUs",
                 "set spec.placement.mode to device-plugin or give a role gpus")]
    return []


def _checkpoint_problems(spec: JobSpec) -> list[Problem]:
    """spec.trainer.checkpoint: with a volume claim, the path is where it is mounted."""
    ckpt = spec.trainer.checkpoint
    if ckpt.volume_claim and ckpt.path is not None and not ckpt.path.startswith("/"):
        return [("trainer.checkpoint.path", "must be an absolute path when volumeClaim is set (it is the mount path)",
                 "set spec.trainer.checkpoint.path to an absolute path such as /checkpoints, or remove it")]
    return []


def _fault_problems(spec: JobSpec) -> list[Problem]:
    """spec.resilience.faults: each at a step the job reaches, in a role that runs."""
    steps, running, out = spec.trainer.steps, enabled_roles(spec), []
    for i, fault in enumerate(spec.resilience.faults):
        if fault.step > steps:
            out.append((f"resilience.faults[{i}].step", f"must be <= trainer.steps ({steps})",
                        "inject the fault at a step the job reaches"))
        if fault.role not in running:
            out.append((f"resilience.faults[{i}].role", f"role {fault.role} is not running in this job",
                        f"pick one of {', '.join(running)}"))
    return out


def context_problems(spec: JobSpec, limits: list[tuple[str, int]]) -> list[Problem]:
    """A prompt and its response must fit the context of each model that reads them (policy, ref, critic: spec.model;
    a reward model). `limits` holds (which model, its max positions); the smallest one is reported, on one line."""
    if not limits:
        return []
    which, limit = min(limits, key=lambda item: item[1])
    prompt, new = spec.data.max_prompt_length, spec.rollout.max_new_tokens
    if prompt + new <= limit:
        return []
    if prompt >= limit:
        return [("data.maxPromptLength", f"is {prompt}, but {which} has a context of {limit} positions, which must "
                                         f"also hold spec.rollout.maxNewTokens ({new})",
                 f"set spec.data.maxPromptLength to at most {limit - new}" if new < limit else
                 f"lower spec.data.maxPromptLength and spec.rollout.maxNewTokens to at most {limit} tokens together")]
    return [("rollout.maxNewTokens", f"is {new}: with spec.data.maxPromptLength ({prompt}) that is {prompt + new} "
                                     f"tokens, more than the {limit} positions of {which}",
             f"set spec.rollout.maxNewTokens to at most {limit - prompt}, or lower spec.data.maxPromptLength")]


def needed_role_problems(spec: JobSpec) -> list[Problem]:
    """Per-role rules: a role the algorithm needs scaled to 0; a GPU model asked of a role without GPUs."""
    out: list[tuple[str, str, str]] = []
    needed = {"actor": "every algorithm", "reward": "every algorithm"}
    if spec.algorithm.name == "ppo":
        needed["critic"] = "ppo (GAE)"
    roles = spec.roles
    for role, who in needed.items():
        if roles.get(role).replicas == 0:
            out.append((f"roles.{role}.replicas", f"is 0, but {who} needs the {role}",
                        f"set spec.roles.{role}.replicas to 1 or more"))
    for role in (*ROLES, *roles.extra):
        rs, at = roles.get(role), roles.path(role)
        if rs.gpu_product and rs.gpus == 0:
            out.append((f"{at}.gpuProduct", f"selects a GPU model ({rs.gpu_product}) but the role has no GPUs",
                        f"set spec.{at}.gpus to 1 or more, or remove gpuProduct"))
        product = rs.node_selector.get(GPU_PRODUCT_LABEL)
        if rs.gpu_product and product is not None and product != rs.gpu_product:
            out.append((f"{at}.gpuProduct", f"is {rs.gpu_product} but nodeSelector {GPU_PRODUCT_LABEL} is {product}",
                        f"give the GPU model once: gpuProduct, or nodeSelector {GPU_PRODUCT_LABEL}"))
    return out


def memory_problems(spec: JobSpec) -> list[Problem]:
    """Offload and LoRA are for roles that train; params offload keeps the optimizer state on the CPU too."""
    out = []
    for role in (*ROLES, *spec.roles.extra):
        off, at = spec.roles.get(role).offload, spec.roles.path(role)
        if role not in TRAINING_ROLES and off.any:
            out.append((f"{at}.offload", f"{role} does not train: offload is for actor and critic",
                        f"remove spec.{at}.offload"))
        if role not in TRAINING_ROLES and spec.roles.get(role).lora.enabled:
            out.append((f"{at}.lora", f"{role} does not train: LoRA is for actor and critic",
                        f"remove spec.{at}.lora"))
        if role in TRAINING_ROLES and off.params and not off.optimizer:
            out.append((f"{at}.offload.optimizer",
                        "must be true with offload.params: FSDP2's CPUOffloadPolicy keeps the optimizer state "
                        "with the parameters, on the CPU", f"set spec.{at}.offload.optimizer to true"))
    return out


def colocation_problems(spec: JobSpec) -> list[Problem]:
    """`colocateWith` of each running role: the host is another running role, not colocated itself (no chains,
    no cycles), with the same replicas and gpus per replica, so that rank r of each role shares rank r's GPUs."""
    running = enabled_roles(spec)
    out = [p for role in running if spec.roles.get(role).colocate_with is not None
           if (p := _host_problem(spec, role, running)) is not None]
    return out + _shared_gpu_problems(spec, running)


def _host_problem(spec: JobSpec, role: str, running: list[str]) -> Problem | None:
    """What is wrong with the role that `role` names in colocateWith, if anything."""
    roles = spec.roles
    host, field = roles.get(role).colocate_with, f"{roles.path(role)}.colocateWith"
    others = ", ".join(r for r in running if r != role)
    if host == role:
        return field, f"names {role} itself", f"name another role ({others}) or remove spec.{field}"
    if host not in (*ROLES, *roles.extra):
        return (field, f"names {host!r}, which is not a role of this job",
                f"name one of {others}, or remove spec.{field}")
    if host not in running:
        return (field, f"names {host}, which does not run in this job (disabled, replicas 0, or a critic without "
                       f"algorithm ppo)", f"name a running role ({others}) or remove spec.{field}")
    if (beyond := roles.get(host).colocate_with) is not None:
        if _colocation_cycle(spec, role):
            return (field, f"names {host}, which is colocated with {beyond} itself: a cycle of colocations",
                    "make one role of the cycle the host: remove its colocateWith")
        return (field, f"names {host}, which is colocated with {beyond} itself: a chain of colocations",
                f"set spec.{field} to {beyond} (colocate every role with the host itself)")
    return _guest_problem(spec, role, host)


def _guest_problem(spec: JobSpec, role: str, host: str) -> Problem | None:
    """A role on a valid host's GPUs: the same shape as the host, and no scheduling fields of its own."""
    roles = spec.roles
    rs, at, hs, hat = roles.get(role), roles.path(role), roles.get(host), roles.path(host)
    field = f"{at}.colocateWith"
    if (rs.replicas, rs.gpus) != (hs.replicas, hs.gpus):
        return (field, f"{role} has {rs.replicas} replicas x {rs.gpus} gpus but {host} has {hs.replicas} x "
                       f"{hs.gpus}: rank r of each shares one replica's GPUs",
                f"set spec.{at}.replicas to {hs.replicas} and spec.{at}.gpus to {hs.gpus} (as spec.{hat}), or remove "
                f"spec.{field}")
    if rs.gpu_product and rs.gpu_product != hs.gpu_product:
        return (f"{at}.gpuProduct", f"is {rs.gpu_product}, but {role} runs on {host}'s GPUs "
                                    f"({hs.gpu_product or 'any model'})",
                f"remove spec.{at}.gpuProduct (spec.{hat}.gpuProduct chooses the GPUs)")
    if own := [f for f in rs.constrained() if f != "gpuProduct"]:
        return (f"{at}.{own[0]}", f"is set, but {role} runs in {host}'s pods, which {host}'s scheduling fields place",
                f"move {', '.join(own)} to spec.{hat}, or remove spec.{field}")
    return None


def _shared_gpu_problems(spec: JobSpec, running: list[str]) -> list[Problem]:
    """Roles sharing GPUs run their phases one after another: no one-step-off rollout beside the actor, no rollout
    role (it generates all the time), no warm standby (it would need a second share of those GPUs)."""
    roles, out = spec.roles, []
    guests = [r for r in running if roles.get(r).colocate_with is not None]
    shared = [r for r in guests if "actor" in (r, roles.get(r).colocate_with)]
    if shared and spec.rollout.asynchronous:
        out.append(("rollout.asynchronous", f"generates beside the updates, but the actor shares its GPUs with "
                                            f"{', '.join(r for r in shared if r != 'actor') or 'its host'}, whose "
                                            f"phases run one after another",
                    "set spec.rollout.asynchronous to false, or remove colocateWith"))
    sharing_gpus = sorted({r for g in guests for r in (g, roles.get(g).colocate_with) if r in running})
    if with_rollout := [g for g in guests if "rollout" in (g, roles.get(g).colocate_with)]:
        field, other = f"{roles.path(with_rollout[0])}.colocateWith", roles.get(with_rollout[0]).colocate_with
        out.append((field, f"puts {with_rollout[0] if other == 'rollout' else 'the rollout role'} on the GPUs of "
                           f"{other}, but the rollout role generates all the time (rollout.async), and roles that "
                           f"share GPUs take turns", f"remove spec.{field}: give the rollout role GPUs of its own"))
    if standing := [r for r in sharing_gpus if spec.standby(r)]:
        field = "resilience.standby" if spec.resilience.standby else f"{roles.path(standing[0])}.standby"
        out.append((field, f"a warm standby would need a second share of the GPUs that colocated roles "
                           f"({', '.join(sharing_gpus)}) share",
                    f"set spec.{roles.path(standing[0])}.standby to false (each role that shares GPUs), or remove "
                    f"colocateWith"))
    return out


def _optim_alias_problems(spec: JobSpec) -> list[Problem]:
    """A deprecated spec.trainer field and the optim field it stands for, both set, to different values."""
    out = []
    for old, (roles, new) in OPTIM_ALIASES.items():
        alias = getattr(spec.trainer, old)
        for role in roles:
            own, at = spec.roles.get(role).optim, f"roles.{role}.optim.{to_camel(new)}"
            value = None if own is None else getattr(own, new)
            if alias is not None and value is not None and value != alias:
                out.append((at, f"is {value}, but the deprecated spec.trainer.{to_camel(old)} it replaces is {alias}",
                            f"remove spec.trainer.{to_camel(old)} (spec.{at} replaces it)"))
    return out


def write_back_aliases(spec: JobSpec) -> None:
    """Set each deprecated spec.trainer alias to the value in effect (null where the roles it stands for differ), so
    that a spec dumped and read again (a worker's) holds no conflict, a spec that sets no optim block dumps as it
    did before the block existed, and code reading an alias reads what trains."""
    effective = {old: [getattr(spec.optim(role), new) for role in roles]
                 for old, (roles, new) in OPTIM_ALIASES.items()}
    for old, values in effective.items():
        setattr(spec.trainer, old, values[0] if values.count(values[0]) == len(values) else None)


def _colocation_cycle(spec: JobSpec, role: str) -> bool:
    """Whether following colocateWith from `role` comes back to a role already seen."""
    seen, at = {role}, spec.roles.get(role).colocate_with
    known = (*ROLES, *spec.roles.extra)
    while at is not None and at in known:
        if at in seen:
            return True
        seen.add(at)
        at = spec.roles.get(at).colocate_with
    return False
