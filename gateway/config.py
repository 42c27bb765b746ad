"""Typed settings: the YAML file a deployment writes, validated once, at start-up or reload.

`load_settings` is the only function here that touches the file system or the environment,
and the environment is injectable so tests never mutate `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Final, Self
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.planner.params import Settings as PlannerSettings
from gateway.precision import Precision, relative_cost
from gateway.protocol import RequestLimits
from gateway.shadow.judges import resolve as resolve_judge

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the offending field."""


class Section(BaseModel):
    # No inf or NaN: `gt=0` lets infinity through, and an infinite timeout, rate or
    # Retry-After breaks the arithmetic (and the headers) that use it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _without_userinfo(url: str) -> str:
    """`url` for a message, without anything up to an `@`: a malformed URL (no `//`) still
    leaves the user:password it may carry outside `netloc`."""
    return url if "@" not in url else "..." + url[url.rindex("@") :]


class Endpoint(Section):
    """One upstream base URL, split once so the hot path never parses URLs."""

    url: str
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if "@" in parts.netloc:
            # Never sent upstream, yet the URL is a label in /metrics (open by default).
            # Checked first, and not echoed: every other message here prints the URL, and
            # with it the password, into the log of a refused reload.
            raise ValueError(
                f"endpoint of host {parts.hostname!r} must not carry a user or password; "
                "the engine's key goes in the tier's api_key_env"
            )
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(
                f"endpoint {_without_userinfo(url)!r} must be an http(s)://host[:port]/path URL"
            )
        if parts.query or parts.fragment:
            # Not echoed either: a query is where some proxies take a key (`?key=...`).
            raise ValueError(
                f"endpoint of host {parts.hostname!r} must not carry a query or fragment"
            )
        if not all("!" <= char <= "~" for char in parts.path):
            # The path goes into the upstream request line as it is: a space or a control
            # character there would break the request.
            raise ValueError(
                f"endpoint {url!r}: its path must be printable ASCII without spaces "
                "(percent-encode anything else)"
            )
        try:
            parts.hostname.encode("idna")
        except UnicodeError:
            raise ValueError(
                f"endpoint {url!r}: {parts.hostname!r} is not a valid host name"
            ) from None
        return cls(
            url=url.rstrip("/"),
            scheme=parts.scheme,
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            base_path=parts.path.rstrip("/"),
        )


class TierSettings(Section):
    name: Name
    precision: Precision
    endpoints: list[str] = Field(min_length=1)
    served_model_name: str | None = Field(default=None, min_length=1)
    max_inflight_per_endpoint: int = Field(default=512, ge=1)
    cost: float | None = Field(default=None, gt=0.0)
    vllm_args: list[str] | None = None
    # For engines started with --api-key (or VLLM_API_KEY): sent upstream as
    # `Authorization: Bearer <key>` on every call. `api_key_env` keeps it out of the file.
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    # CA bundle that https endpoints' certificates are verified against (default: the
    # system's trust store). Verification is never turned off.
    tls_ca_file: Path | None = None
    # The gateway's own certificate (PEM, with its chain) and key, for engines that ask for
    # one (mutual TLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("set api_key or api_key_env, not both")
        if self.api_key is not None:
            _check_header_value(self.api_key.get_secret_value(), "api_key")
        tls_files = {
            "tls_ca_file": self.tls_ca_file,
            "tls_cert_file": self.tls_cert_file,
            "tls_key_file": self.tls_key_file,
        }
        named = [name for name, value in tls_files.items() if value is not None]
        if named and not any(Endpoint.parse(url).scheme == "https" for url in self.endpoints):
            raise ValueError(f"{', '.join(named)}: for https endpoints; this tier has none")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_key_file needs tls_cert_file")
        return self

    @field_validator("endpoints")
    @classmethod
    def _endpoints_parse(cls, value: list[str]) -> list[str]:
        # Compared as parsed: `…/v1` and `…/v1/` are one engine, which two endpoint states
        # would each allow max_inflight_per_endpoint, and export as duplicate series.
        urls = [Endpoint.parse(url).url for url in value]
        if len(set(urls)) != len(urls):
            raise ValueError("endpoints must be distinct")
        return value

    @property
    def parsed_endpoints(self) -> list[Endpoint]:
        return [Endpoint.parse(url) for url in self.endpoints]

    @property
    def relative_cost(self) -> float:
        return self.cost if self.cost is not None else relative_cost(self.precision)


class TenantLimitSettings(Section):
    """Per-tenant admission limits; unset means unlimited (or the gateway-wide limit)."""

    requests_per_second: float | None = Field(default=None, gt=0.0)
    burst: float | None = Field(default=None, gt=0.0)
    tokens_per_minute: float | None = Field(default=None, gt=0.0)
    max_concurrency: int | None = Field(default=None, ge=1)
    max_body_bytes: int | None = Field(default=None, ge=1024)
    max_tokens: int | None = Field(default=None, ge=1)


class TenantSettings(Section):
    name: Name
    # SecretStr: keys never appear in a repr, a log line or a settings dump.
    api_keys: list[SecretStr] = Field(default_factory=list)
    api_keys_env: str | None = None
    allowed_tiers: list[str] | None = None
    allow_pinning: bool = True
    thresholds: dict[str, Probability] | None = None
    alpha: float | None = Field(default=None, gt=0.0, le=1.0)
    limits: TenantLimitSettings = TenantLimitSettings()
    # When every tier at or above the chosen one is saturated, a cheaper tier may serve
    # if its calibrated probability still reaches this floor.
    degrade_under_saturation: bool = False
    degrade_min_probability: Probability = 0.5
    # Shadow evaluation: this tenant's share of cheaper-tier requests replayed on the top
    # tier (None: the gateway-wide rate), and whether its label lines may keep raw text.
    shadow_rate: Probability | None = None
    shadow_keep_text: bool | None = None
    # The tenant's own prefix-cache namespace at the engines (vLLM's cache_salt), so that
    # no other tenant can reuse its cached prompts and read their presence from its timing.
    isolate_prefix_cache: bool = True

    @model_validator(mode="after")
    def _thresholds_or_alpha(self) -> Self:
        if self.thresholds is not None and self.alpha is not None:
            raise ValueError("set either thresholds or alpha, not both")
        return self


class TimeoutSettings(Section):
    connect_s: float = Field(default=3.0, gt=0.0)
    first_byte_s: float = Field(default=120.0, gt=0.0)
    total_s: float = Field(default=900.0, gt=0.0)


class ResilienceSettings(Section):
    failure_threshold: int = Field(default=5, ge=1)  # consecutive failures that eject
    base_ejection_s: float = Field(default=5.0, gt=0.0)
    max_ejection_s: float = Field(default=60.0, gt=0.0)
    health_interval_s: float = Field(default=2.0, gt=0.0)
    queue_size: int = Field(default=256, ge=0)  # requests that may wait per tier
    queue_timeout_s: float = Field(default=5.0, ge=0.0)
    retry_after_s: float = Field(default=1.0, gt=0.0)

    @model_validator(mode="after")
    def _ejection_grows_to_its_cap(self) -> Self:
        if self.base_ejection_s > self.max_ejection_s:
            raise ValueError(
                f"base_ejection_s ({self.base_ejection_s}) exceeds max_ejection_s "
                f"({self.max_ejection_s}): an ejection starts at the base and doubles up to "
                "the cap"
            )
        return self


MAX_OBSERVER_BUCKETS: Final = 100_000


class ObserverSettings(Section):
    """The live regime observer and planner (COST_MODEL.md b.1, c)."""

    enabled: bool = True
    # Share of conversations replayed, chosen by a hash of the conversation's root.
    sample_rate: float = Field(default=0.1, ge=0.0, le=1.0)
    # Each sample costs two /tokenize calls: a cap keeps the observer's cost bounded in
    # absolute terms at high traffic, where a few samples per second are plenty. It lowers
    # the hash threshold as traffic grows (a token bucket catches bursts).
    max_samples_per_s: float = Field(default=20.0, gt=0.0)
    queue_size: int = Field(default=1000, ge=1)  # samples waiting; more are dropped
    window_s: float = Field(default=300.0, gt=0.0)
    bucket_s: float = Field(default=5.0, gt=0.0)
    scrape_interval_s: float = Field(default=15.0, gt=0.0)
    plan_interval_s: float = Field(default=60.0, gt=0.0)

    @model_validator(mode="after")
    def _window_holds_few_buckets(self) -> Self:
        # The trackers keep window_s / bucket_s buckets and walk them on the request path's
        # events; a ratio of 1e600 does not even make an int (a reload half applied).
        buckets = self.window_s / self.bucket_s
        if not buckets <= MAX_OBSERVER_BUCKETS:
            raise ValueError(
                f"window_s / bucket_s is {buckets:g} buckets; at most {MAX_OBSERVER_BUCKETS}"
            )
        return self


class ShadowSettings(Section):
    """Shadow evaluation and online recalibration (off unless `rate` > 0)."""

    rate: Probability = 0.0  # share of cheaper-tier requests replayed on the top tier
    # Share of top-tier requests replayed on a random cheaper tier. Without it, labels for a
    # cheap tier stop once the router sends hard requests up: the calibration could never
    # learn where the cheap tier fails (the selection bias of logged routing data).
    explore_rate: Probability = 0.0
    max_concurrency: int = Field(default=4, ge=1)  # replays in flight
    budget_share: Probability = 0.1  # at most this share of the top tier's request slots
    queue_size: int = Field(default=256, ge=1)
    # At least one: with none, every replay ran (its cost counted as overspend) and none
    # could be judged, so no label ever came.
    judges: list[str] = Field(
        default_factory=lambda: ["choice", "number", "normalized"], min_length=1
    )
    # Tiers known to decode deterministically whatever the sampling parameters (the
    # simulator): text judges then apply to every pair, not only to greedy or seeded ones.
    assume_deterministic: bool = False
    label_log: Path | None = None
    label_log_max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    label_log_backups: int = Field(default=3, ge=0)
    keep_text: bool = False  # default for tenants that do not say
    # Recent labels kept per tenant and tier, in memory (a deque maxlen, so bounded).
    window: int = Field(default=2000, ge=10, le=10_000_000)
    recalibrate_interval_s: float = Field(default=60.0, gt=0.0)
    min_labels: int = Field(default=50, ge=1)  # per tier, before a refit
    prior_weight: float = Field(default=20.0, ge=0.0)  # pseudo-labels from the shipped model
    drift_margin: Probability = 0.1  # alarm when observed < predicted - margin

    @field_validator("judges")
    @classmethod
    def _judges_resolve(cls, value: list[str]) -> list[str]:
        # A misspelt name or a plug-in that does not import is refused here, where a start
        # or a reload can still say so, not in every shadow worker afterwards.
        for name in value:
            resolve_judge(name)
        return value


class SharedLimitSettings(Section):
    """Where per-tenant limits live: this replica's memory, or Redis shared by replicas."""

    redis_url: SecretStr | None = None
    redis_url_env: str | None = "TIERGATE_REDIS_URL"
    key_prefix: str = "tiergate"


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=256)


class AdminSettings(Section):
    token: str | None = None
    token_env: str | None = "TIERGATE_ADMIN_TOKEN"


DEFAULT_METRICS_TOKEN_ENV: Final = "TIERGATE_METRICS_TOKEN"


class MetricsSettings(Section):
    """Who may read /metrics. Without a token anyone who reaches the port can (tenant and tier
    names, endpoint URLs, cost figures): keep the path inside the cluster, or set a token and
    give it to the scraper (Prometheus `authorization: credentials`)."""

    token: str | None = None
    token_env: str | None = DEFAULT_METRICS_TOKEN_ENV


class RouterSettings(Section):
    model_dir: Path | None = None
    default_threshold: Probability = 0.8


class Settings(Section):
    model: str = Field(min_length=1)
    tiers: list[TierSettings] = Field(min_length=2)
    tenants: list[TenantSettings] = Field(min_length=1)
    server: ServerSettings = ServerSettings()
    limits: RequestLimits = RequestLimits()
    timeouts: TimeoutSettings = TimeoutSettings()
    resilience: ResilienceSettings = ResilienceSettings()
    observer: ObserverSettings = ObserverSettings()
    shared_limits: SharedLimitSettings = SharedLimitSettings()
    shadow: ShadowSettings = ShadowSettings()
    planner: PlannerSettings = PlannerSettings()
    admin: AdminSettings = AdminSettings()
    metrics: MetricsSettings = MetricsSettings()
    router: RouterSettings = RouterSettings()

    @field_validator("model")
    @classmethod
    def _model_takes_no_pin_separator(cls, value: str) -> str:
        # A client pins a tier as `<model>@<tier>`, split at the first `@`: with one in the
        # name itself no pin matched, and the 404 said to send exactly what it refused.
        if "@" in value:
            raise ValueError("must not contain '@', which separates the model from a tier pin")
        return value

    @model_validator(mode="after")
    def _cross_references(self) -> Self:
        tier_names = [tier.name for tier in self.tiers]
        _require_unique("tiers", tier_names)
        _require_unique("tenants", [tenant.name for tenant in self.tenants])
        for cheaper, dearer in pairwise(self.tiers):
            # The router walks the ladder cheapest first: a dearer tier before a cheaper one
            # would be chosen first, and savings would be counted backwards.
            if dearer.relative_cost < cheaper.relative_cost:
                raise ValueError(
                    f"tiers are listed cheapest first, but {dearer.name!r} (cost "
                    f"{dearer.relative_cost:g}) comes after {cheaper.name!r} (cost "
                    f"{cheaper.relative_cost:g}); reorder them or fix tiers[].cost"
                )
        known = set(tier_names)
        for tenant in self.tenants:
            for field, names in (
                ("allowed_tiers", tenant.allowed_tiers or []),
                ("thresholds", list((tenant.thresholds or {}).keys())),
            ):
                unknown = sorted(set(names) - known)
                if unknown:
                    raise ValueError(
                        f"tenant {tenant.name!r}: {field} names unknown tiers {unknown}; "
                        f"tiers are {tier_names}"
                    )
            if tenant.allowed_tiers is not None and not tenant.allowed_tiers:
                raise ValueError(f"tenant {tenant.name!r}: allowed_tiers must not be empty")
            # A tier listed twice stood next to itself at the same cost, so the router never
            # chose it (threshold 1.0), and it was tried and listed in /v1/models twice.
            _require_unique(f"tenant {tenant.name!r}: allowed_tiers", tenant.allowed_tiers or [])
            if tenant.thresholds and tier_names[-1] in tenant.thresholds:
                raise ValueError(
                    f"tenant {tenant.name!r}: thresholds name the top tier "
                    f"{tier_names[-1]!r}, which takes none (it serves what no cheaper tier "
                    "may); set thresholds for the cheaper tiers"
                )
        return self

    def tier_index(self, name: str) -> int | None:
        for index, tier in enumerate(self.tiers):
            if tier.name == name:
                return index
        return None


def _require_unique(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{field}: name {name!r} is used twice")
        seen.add(name)


def parse_settings(data: Any, source: yaml.Node | None = None) -> Settings:
    """Validates an already-loaded mapping; raises ConfigError naming the field, and its line
    when `source` is the YAML node the mapping was read from."""
    if not isinstance(data, dict):
        raise ConfigError("configuration must be a YAML mapping at the top level")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def load_settings(path: str | Path) -> Settings:
    """Reads and validates a YAML file; raises ConfigError with a readable message."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start})") from None
    loader = _UniqueKeyLoader(text)  # a SafeLoader: plain data only
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # the YAML parser recurses once per level of nesting
        raise ConfigError(f"{file}: not a configuration: nested too deeply") from None
    finally:
        loader.dispose()
    try:
        return parse_settings(data, node)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without PyYAML's snippet of the line: that line may hold a
    key or token, and the message goes to the log of a refused reload."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    mark = exc.problem_mark
    context = f"{exc.context}: " if exc.context else ""
    return f"{context}{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key written twice in one mapping. PyYAML keeps
    the last one silently: a second `tenants:` block appended to a file would drop the
    first one's tenants (their keys answered 401 after the reload), and `check` would call
    the file valid."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` then overriding one of its keys is the idiom
            key = self.construct_object(key_node, deep=True)
            # Only scalars: a list or mapping key is unhashable, and PyYAML refuses it below
            # as a YAMLError (adding it to `seen` raised a TypeError no caller expects).
            if not isinstance(key, str | int | float | bool):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} a second time",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def resolve_secret(value: str | None, env_name: str | None, environ: Mapping[str, str]) -> str:
    """A secret given inline or through an environment variable; empty when neither is set.
    Surrounding whitespace is dropped: a secret made from a file (`kubectl create secret
    --from-file`) ends in a newline no client sends, and the token could never match."""
    if value:
        return _trimmed(value, "an inline secret")
    if env_name:
        return _trimmed(environ.get(env_name, ""), f"${env_name}")
    return ""


def _trimmed(raw: str, where: str) -> str:
    secret = raw.strip()
    if raw and not secret:
        # Read as "no token", it would leave its endpoint open (or the admin API off).
        raise ConfigError(f"{where} holds only whitespace")
    return secret


def _check_header_value(value: str, what: str) -> None:
    # Printable ASCII without spaces: anything else could end the header line or break the
    # `Bearer <key>` form.
    if not value or not all("!" <= char <= "~" for char in value):
        raise ValueError(f"{what} must be non-empty printable ASCII without spaces")


def resolve_metrics_token(metrics: MetricsSettings, environ: Mapping[str, str]) -> str:
    """The bearer token /metrics asks for ('' leaves it open). A `token_env` other than the
    default must be set: unset, /metrics would be open to anyone while the file asked for a
    token (the default name, unset, leaves it open, as documented)."""
    if metrics.token:
        return _trimmed(metrics.token, "metrics.token")
    if metrics.token_env is None:
        return ""
    token = environ.get(metrics.token_env)
    if token is None and metrics.token_env != DEFAULT_METRICS_TOKEN_ENV:
        raise ConfigError(
            f"metrics.token_env names ${metrics.token_env}, which is not set: /metrics would "
            "be open to anyone (set it, or drop token_env to leave /metrics open)"
        )
    return _trimmed(token or "", f"${metrics.token_env}")


def tier_api_key(tier: TierSettings, environ: Mapping[str, str] | None = None) -> str | None:
    """The key the tier's engines expect, or None when it sets none. An empty variable means
    no key, as vLLM reads an empty VLLM_API_KEY (one secret can feed both, empty or not);
    an unset one is a ConfigError, since it is most likely a misspelt name."""
    if tier.api_key is not None:
        return tier.api_key.get_secret_value()
    if tier.api_key_env is None:
        return None
    env = os.environ if environ is None else environ
    key = env.get(tier.api_key_env)
    if key is None:
        raise ConfigError(
            f"tier {tier.name}: api_key_env names ${tier.api_key_env}, which is not set "
            "(set it empty for engines without a key)"
        )
    if not key:
        return None
    try:
        _check_header_value(key, f"tier {tier.name}: ${tier.api_key_env}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return key


def tenant_keys(tenant: TenantSettings, environ: Mapping[str, str] | None = None) -> list[str]:
    """The tenant's keys from config plus the comma-separated list in its env variable. An
    unset variable is a ConfigError, as for a tier's key: most likely a misspelt name or a
    missing secret, and serving on would answer the tenant's every request with a 401."""
    env = os.environ if environ is None else environ
    keys = [key.get_secret_value() for key in tenant.api_keys]
    if tenant.api_keys_env:
        listed = env.get(tenant.api_keys_env)
        if listed is None:
            raise ConfigError(
                f"tenant {tenant.name}: api_keys_env names ${tenant.api_keys_env}, which is "
                "not set (set it to the tenant's keys, comma-separated)"
            )
        keys.extend(k.strip() for k in listed.split(",") if k.strip())
    return keys


def _describe(exc: ValidationError, source: yaml.Node | None = None) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        line = None if source is None else _line_of(source, error["loc"])
        at = "" if line is None else f" (line {line})"
        lines.append(f"{where}: {error['msg']}{at}")
    return "invalid configuration: " + "; ".join(lines)


def _line_of(node: yaml.Node, path: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the deepest node along a validation error's path (the key, for a
    mapping entry); None for an error about the whole file."""
    line = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            entry = next((pair for pair in node.value if pair[0].value == str(part)), None)
            if entry is None:
                break
            line, node = entry[0].start_mark.line + 1, entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def default_settings(
    port: int = 8000, sim_ports: tuple[int, int, int] = (9001, 9002, 9003)
) -> Settings:
    """The embedded default: three simulated tiers of one checkpoint, one dev tenant."""
    ladder = (("nvfp4", "nvfp4"), ("w4a16", "w4a16"), ("bf16", "bf16"))
    return Settings(
        model="qwen3-30b-a3b",
        tiers=[
            TierSettings(
                name=name,
                precision=precision,  # type: ignore[arg-type]
                endpoints=[f"http://127.0.0.1:{sim_port}/v1"],
                served_model_name=f"qwen3-30b-a3b-{name}",
            )
            for (name, precision), sim_port in zip(ladder, sim_ports, strict=True)
        ],
        tenants=[TenantSettings(name="default", api_keys=[SecretStr("sk-local-dev")])],
        server=ServerSettings(port=port),
    )


__all__ = [
    "AdminSettings",
    "ConfigError",
    "Endpoint",
    "ObserverSettings",
    "ResilienceSettings",
    "RouterSettings",
    "ServerSettings",
    "Settings",
    "ShadowSettings",
    "SharedLimitSettings",
    "TenantLimitSettings",
    "TenantSettings",
    "TierSettings",
    "TimeoutSettings",
    "default_settings",
    "load_settings",
    "parse_settings",
    "resolve_secret",
    "tenant_keys",
    "tier_api_key",
]
