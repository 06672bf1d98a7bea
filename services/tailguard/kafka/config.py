"""Kafka client settings, in one place for every client tailguard makes.

Any setting named `kafka.<librdkafka key>` (in the TOML file, the environment or an override)
is passed to every librdkafka client - the agent's producer and consumer, a service's state
rebuild, replay from the topics, the dead-letter reader - and `kafka.producer.<key>` /
`kafka.consumer.<key>` to one role only; these win over the defaults chosen by each client.

The services' faust apps speak Kafka through aiokafka, which takes no librdkafka settings:
`faust_app_options` maps the same `kafka.*` security settings (security.protocol,
sasl.mechanism(s), sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location,
ssl.key.location, ssl.key.password, ...) to faust's `broker_credentials` with an
`ssl.SSLContext`, and refuses with a `ConfigError` naming the setting what aiokafka cannot do,
rather than connect with less security than configured.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tailguard.kafka.bootstrap import resolve_bootstrap
from tailguard.model.config import ConfigError

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

PREFIX = "kafka."
ROLES = ("producer", "consumer")

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# librdkafka's default mechanism when SASL is on.
DEFAULT_MECHANISM = "GSSAPI"
PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# The librdkafka TLS settings the faust client can honour; any other ssl.* setting is refused.
SSL_KEYS = frozenset(
    {
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.crl.location",
        "ssl.cipher.suites",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
    }
)
# Kerberos settings with which librdkafka runs kinit itself; aiokafka uses the process's ticket
# cache instead.
_KINIT_KEYS = (
    "sasl.kerberos.principal",
    "sasl.kerberos.keytab",
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin",
)


def _role_settings(settings: Mapping[str, str], role: str) -> dict[str, str]:
    """The librdkafka settings for a client of `role`: `kafka.*`, then `kafka.<role>.*`."""
    config: dict[str, str] = {}
    own = f"{PREFIX}{role}."
    roles = tuple(f"{PREFIX}{r}." for r in ROLES)
    for key, value in settings.items():
        if key.startswith(PREFIX) and not key.startswith(roles):
            config[key[len(PREFIX) :]] = value
    for key, value in settings.items():
        if key.startswith(own):
            config[key[len(own) :]] = value
    return config


def client_config(
    settings: Mapping[str, str], role: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The librdkafka config for a client of `role` ("producer" or "consumer")."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    return {
        "bootstrap.servers": resolve_bootstrap(settings),
        **defaults,
        **_role_settings(settings, role),
    }


# librdkafka's mock cluster (`tailguard broker up --mock`) names itself "mockCluster<hex>"
# (rd_kafka_mock_cluster_new in rdkafka_mock.c); a Kafka cluster's id is a base64 UUID.
EMBEDDED_CLUSTER_PREFIX = "mockCluster"
FETCH_WAIT_KEY = "fetch.wait.max.ms"
# Kafka answers a fetch as soon as data arrives: the wait only bounds how often an idle consumer
# asks again, so Kafka's own default costs no latency there.
KAFKA_FETCH_WAIT_MS = 500


def is_embedded_cluster(cluster_id: str | None) -> bool:
    """Whether the broker that answered with `cluster_id` is librdkafka's mock cluster."""
    return cluster_id is not None and cluster_id.startswith(EMBEDDED_CLUSTER_PREFIX)


def configured_fetch_wait_ms(settings: Mapping[str, str]) -> int | None:
    """`kafka.consumer.fetch.wait.max.ms` (or `kafka.fetch.wait.max.ms`) if set, else None."""
    value = _role_settings(settings, "consumer").get(FETCH_WAIT_KEY)
    if value is None:
        return None
    try:
        wait = int(str(value).strip())
    except ValueError:
        wait = -1
    if wait < 0:
        raise ConfigError(
            f"{PREFIX}consumer.{FETCH_WAIT_KEY}: expected whole milliseconds (>= 0), got {value!r}"
        )
    return wait


class FetchWait(NamedTuple):
    ms: int
    why: str  # for the log line that says which wait a client chose


def fetch_wait(settings: Mapping[str, str], cluster_id: str | None, embedded_ms: int) -> FetchWait:
    """How long a consumer's fetch may wait for data: the configured wait if there is one; else
    `embedded_ms` on the mock broker, which answers a fetch with no data only when the wait
    expires, even if data arrives meanwhile (every hop pays up to it), and Kafka's default on
    Kafka. A cluster not reached yet (`cluster_id` None) gets `embedded_ms`: a short wait on
    Kafka costs only idle requests, a long one on the mock broker costs every decision."""
    configured = configured_fetch_wait_ms(settings)
    if configured is not None:
        return FetchWait(configured, f"{PREFIX}consumer.{FETCH_WAIT_KEY} is set")
    if cluster_id is None:
        return FetchWait(embedded_ms, "no broker answered yet: the mock broker's wait")
    if is_embedded_cluster(cluster_id):
        return FetchWait(embedded_ms, f"cluster {cluster_id} is the mock broker")
    return FetchWait(KAFKA_FETCH_WAIT_MS, f"cluster {cluster_id} is Kafka")


def is_security_key(key: str) -> bool:
    """Whether librdkafka setting `key` is about authentication or encryption."""
    return key in ("security.protocol", "enable.ssl.certificate.verification") or key.startswith(
        ("sasl.", "ssl.", "ssl_")
    )


def security_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """The security settings of a client that both consumes and produces (a faust app): they
    must be the same for both roles, since one set of credentials serves both."""
    by_role = {
        role: {k: v for k, v in _role_settings(settings, role).items() if is_security_key(k)}
        for role in ROLES
    }
    producer, consumer = by_role["producer"], by_role["consumer"]
    differing = sorted(
        k for k in producer.keys() | consumer.keys() if producer.get(k) != consumer.get(k)
    )
    if differing:
        raise ConfigError(
            "the services' faust app consumes and produces over one connection, so "
            f"kafka.producer.* and kafka.consumer.* must agree on {', '.join(differing)}"
        )
    return consumer


def _flag(security: Mapping[str, str], key: str, default: bool) -> bool:
    raw = security.get(key)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ConfigError(f"{PREFIX}{key}: not a boolean: {raw!r}")


def ssl_context(security: Mapping[str, str]) -> ssl.SSLContext:
    """An SSLContext that does what librdkafka does with the same `ssl.*` settings."""
    unsupported = sorted(
        k for k in security if k.startswith(("ssl.", "ssl_")) and k not in SSL_KEYS
    )
    if unsupported:
        raise ConfigError(
            f"{', '.join(PREFIX + k for k in unsupported)}: not supported by the services' "
            "faust client (aiokafka takes PEM files: use ssl.ca.location, "
            "ssl.certificate.location, ssl.key.location and ssl.key.password)"
        )
    ca = security.get("ssl.ca.location", "").strip()
    # librdkafka's "probe" looks for the system's CA bundle: Python's defaults do the same.
    ca_dir = bool(ca) and ca != "probe" and Path(ca).is_dir()
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=ca if ca and ca != "probe" and not ca_dir else None,
            capath=ca if ca_dir else None,
            cadata=security.get("ssl.ca.pem") or None,
        )
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"{PREFIX}ssl.ca.location / ssl.ca.pem: cannot load CAs: {err}") from None
    _load_client_certificate(context, security)
    crl = security.get("ssl.crl.location")
    if crl:
        try:
            context.load_verify_locations(cafile=crl)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"{PREFIX}ssl.crl.location: cannot load {crl!r}: {err}") from None
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    ciphers = security.get("ssl.cipher.suites")
    if ciphers:
        try:
            context.set_ciphers(ciphers)
        except ssl.SSLError:
            raise ConfigError(
                f"{PREFIX}ssl.cipher.suites: no usable cipher in {ciphers!r}"
            ) from None
    algorithm = security.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none"):
        raise ConfigError(
            f"{PREFIX}ssl.endpoint.identification.algorithm: {algorithm!r} is not https or none"
        )
    verify = _flag(security, "enable.ssl.certificate.verification", True)
    # check_hostname first: it cannot stay on once verification is off.
    context.check_hostname = verify and algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    return context


def _load_client_certificate(context: ssl.SSLContext, security: Mapping[str, str]) -> None:
    cert = security.get("ssl.certificate.location", "").strip()
    key = security.get("ssl.key.location", "").strip()
    if key and not cert:
        raise ConfigError(f"{PREFIX}ssl.key.location is set without ssl.certificate.location")
    if not cert:
        return
    try:
        context.load_cert_chain(
            cert, key or None, password=security.get("ssl.key.password") or None
        )
    except FileNotFoundError as err:
        raise ConfigError(f"{PREFIX}ssl.certificate.location / ssl.key.location: {err}") from None
    except (OSError, ssl.SSLError) as err:
        # Never the password itself, only that it may be the cause.
        raise ConfigError(
            f"{PREFIX}ssl.certificate.location {cert!r} / ssl.key.location {key!r}: cannot "
            f"load the client certificate and key (a wrong ssl.key.password?): {err}"
        ) from None


def _mechanism(security: Mapping[str, str]) -> str:
    # librdkafka takes both names (`sasl.mechanism` is the alias).
    given = {
        k: security[k].strip().upper()
        for k in ("sasl.mechanisms", "sasl.mechanism")
        if k in security
    }
    if len(set(given.values())) > 1:
        raise ConfigError(f"{PREFIX}sasl.mechanism and {PREFIX}sasl.mechanisms differ")
    return next(iter(given.values()), DEFAULT_MECHANISM)


def faust_credentials(security: Mapping[str, str]) -> CredentialsT | None:
    """faust's `broker_credentials` for the librdkafka security settings `security` (keys
    without the `kafka.` prefix); None for PLAINTEXT. As in librdkafka, settings the protocol
    does not use (SASL settings with SSL, any with PLAINTEXT) are not used."""
    from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials

    protocol = security.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{PREFIX}security.protocol: {protocol!r} is not one of {PROTOCOLS}")
    if protocol == "PLAINTEXT":
        return None
    context = ssl_context(security) if protocol.endswith("SSL") else None
    if protocol == "SSL":
        assert context is not None
        return SSLCredentials(context)
    mechanism = _mechanism(security)
    if mechanism in PASSWORD_MECHANISMS:
        missing = [k for k in ("sasl.username", "sasl.password") if not security.get(k)]
        if missing:
            raise ConfigError(f"SASL {mechanism} needs {' and '.join(PREFIX + k for k in missing)}")
        return SASLCredentials(
            username=security["sasl.username"],
            password=security["sasl.password"],
            mechanism=mechanism,
            ssl_context=context,
        )
    if mechanism == "GSSAPI":
        kinit = [PREFIX + k for k in _KINIT_KEYS if k in security]
        if kinit:
            raise ConfigError(
                f"{', '.join(kinit)}: the services' faust client (aiokafka) does not run kinit; "
                "it uses the process's Kerberos ticket cache: run kinit (or set "
                "KRB5_CLIENT_KTNAME to a keytab) for the services, and drop these settings"
            )
        return GSSAPICredentials(
            kerberos_service_name=security.get("sasl.kerberos.service.name", "kafka"),
            ssl_context=context,
        )
    raise ConfigError(
        f"{PREFIX}sasl.mechanism {mechanism!r}: not supported by the services' faust client "
        f"(supported: {', '.join((*PASSWORD_MECHANISMS, 'GSSAPI'))})"
    )


def faust_app_options(settings: Mapping[str, str]) -> dict[str, Any]:
    """The `faust.App` keyword arguments that connect a service to the configured Kafka."""
    bootstrap = resolve_bootstrap(settings)
    brokers = [b.strip() for b in bootstrap.split(",") if b.strip()]
    return {
        "broker": ";".join(f"kafka://{b}" for b in brokers),
        "broker_credentials": faust_credentials(security_settings(settings)),
    }
