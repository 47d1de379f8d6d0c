"""System checks for ``settings.PLURKCORE`` (ids plurkcore.E001... and plurkcore.W001...)."""
import numbers

from django.conf import settings
from django.core import checks

from . import conf


def _is_number(value, minimum=0, allow_zero=False):
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and (value > minimum or (allow_zero and value == minimum)))


def check_settings(app_configs=None, **kwargs):
    errors = []
    user = getattr(settings, "PLURKCORE", None)
    if user is not None and not isinstance(user, dict):
        return [checks.Error("PLURKCORE must be a dict.", hint="See DEFAULTS in plurkcore/conf.py.",
                             id="plurkcore.E001")]
    unknown = sorted(set(user or {}) - set(conf.DEFAULTS))
    if unknown:
        errors.append(checks.Warning(f"PLURKCORE has unknown keys: {', '.join(unknown)}.",
                                     hint="Check the spelling against plurkcore.conf.DEFAULTS.",
                                     id="plurkcore.W001"))
    config = conf.get_config()
    servers = config["MEMCACHED_SERVERS"]
    if (not isinstance(servers, (list, tuple)) or not servers
            or not all(isinstance(s, str) and _valid_server(s) for s in servers)):
        errors.append(checks.Error(
            f"PLURKCORE['MEMCACHED_SERVERS'] must be a non-empty list of 'host:port' strings, "
            f"got {servers!r}.", id="plurkcore.E002"))
    elif len(set(servers)) != len(servers):
        errors.append(checks.Error("PLURKCORE['MEMCACHED_SERVERS'] lists a server twice.",
                                   id="plurkcore.E002"))
    for name in ("MEMCACHED_TIMEOUT", "MEMCACHED_RETRY_INTERVAL", "REPAIR_INTERVAL"):
        if not _is_number(config[name]):
            errors.append(checks.Error(f"PLURKCORE['{name}'] must be a positive number of seconds, "
                                       f"got {config[name]!r}.", id="plurkcore.E003"))
    if _is_number(config["MEMCACHED_TIMEOUT"]) and config["MEMCACHED_TIMEOUT"] > 1:
        errors.append(checks.Warning(
            "PLURKCORE['MEMCACHED_TIMEOUT'] is above one second: a dead memcached server will "
            "slow every write down by that much.", id="plurkcore.W002"))
    for name in ("TOKEN_TTL", "CACHE_TTL", "CAS_ATTEMPTS", "BATCH_SIZE", "MAX_BODY_SIZE"):
        value = config[name]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(checks.Error(f"PLURKCORE['{name}'] must be a positive integer, got {value!r}.",
                                       id="plurkcore.E004"))
    if isinstance(config["CACHE_TTL"], int) and config["CACHE_TTL"] > 30 * 24 * 3600:
        errors.append(checks.Error(
            "PLURKCORE['CACHE_TTL'] must be at most 30 days (memcached reads larger values as a "
            "Unix timestamp).", id="plurkcore.E004"))
    path = config["SECRET_FILE"]
    if not path or not isinstance(path, str):
        errors.append(checks.Error("PLURKCORE['SECRET_FILE'] is not set.",
                                   hint="Point it at the secret shared with fastpath.", id="plurkcore.E005"))
    else:
        from .secret import SecretFileError, read_secret

        try:
            read_secret(path)
        except SecretFileError as exc:
            errors.append(checks.Error(str(exc), id="plurkcore.E006"))
    if config["COOKIE_NAME"] != "plurk_token":
        errors.append(checks.Warning("PLURKCORE['COOKIE_NAME'] differs from the contract's plurk_token: "
                                     "fastpath will not see the cookie.", id="plurkcore.W003"))
    if "django.middleware.csrf.CsrfViewMiddleware" not in settings.MIDDLEWARE:
        errors.append(checks.Warning(
            "CsrfViewMiddleware is not installed: signup/login cannot set the csrftoken cookie.",
            id="plurkcore.W004"))
    return errors


def _valid_server(spec):
    from .cache import parse_server

    try:
        parse_server(spec)
    except ValueError:
        return False
    return True


def register():
    checks.register(check_settings, checks.Tags.compatibility)
