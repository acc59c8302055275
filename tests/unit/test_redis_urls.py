"""Redis URLs and the settings that complete them: every kind parses, options are
checked, nothing is silently ignored, and no message or view shows a password."""

from pathlib import Path

import pytest

from control_plane.settings import SettingsError, load_settings
from limiter.redis_url import TlsConfig, parse_redis_url

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("url", "kind", "labels", "db"),
    [
        ("redis://10.0.0.1:6380/2", "standalone", ["10.0.0.1:6380"], 2),
        ("rediss://u:p@h:6390/0", "standalone", ["h:6390"], 0),
        ("redis+cluster://a:1,b:2", "cluster", ["a:1", "b:2"], 0),
        ("rediss+cluster://a:1", "cluster", ["a:1"], 0),
        ("redis://a:1?cluster=true", "cluster", ["a:1"], 0),
        ("redis+sentinel://a:26379,b:26380/mymaster", "sentinel", ["a:26379", "b:26380"], 0),
        ("rediss+sentinel://u:p@a/mymaster/3", "sentinel", ["a:26379"], 3),
    ],
)
def test_every_kind_parses(url, kind, labels, db):
    t = parse_redis_url(url)
    assert t.kind == kind
    assert [s.label for s in t.seeds] == labels
    assert t.endpoint.db == db
    assert t.endpoint.use_ssl == url.startswith("rediss")


def test_sentinel_credentials_and_service():
    t = parse_redis_url(f"redis+sentinel://app:{SECRET}@a:1,b:2/orders/1")
    assert t.service_name == "orders"
    assert (t.endpoint.username, t.endpoint.password, t.endpoint.db) == ("app", SECRET, 1)
    assert all((s.username, s.password) == ("app", SECRET) for s in t.seeds)  # the sentinels too, by default
    own = parse_redis_url(f"redis+sentinel://app:{SECRET}@a:1/orders?sentinel_username=s&sentinel_password=x")
    assert [(s.username, s.password) for s in own.seeds] == [("s", "x")]
    none = parse_redis_url(f"redis+sentinel://app:{SECRET}@a:1/orders?sentinel_password=")
    assert (none.seeds[0].username, none.seeds[0].password) == (None, None)
    assert (none.endpoint.username, none.endpoint.password) == ("app", SECRET)


def test_tls_options():
    t = parse_redis_url(
        "rediss://h:1/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_cert_reqs=required"
    )
    assert t.endpoint.tls == TlsConfig("/ca.pem", "/c.pem", "/k.pem", "required", True)
    assert parse_redis_url("rediss://h").endpoint.tls == TlsConfig()  # verify + name check by default
    off = parse_redis_url("rediss://h?ssl_cert_reqs=none").endpoint.tls
    assert off is not None and (off.cert_reqs, off.check_hostname) == ("none", False)
    assert parse_redis_url("rediss://h?ssl_check_hostname=false").endpoint.tls == TlsConfig(check_hostname=False)
    assert parse_redis_url("rediss+sentinel://a/m?ssl_ca_certs=/ca").seeds[0].tls == TlsConfig(ca_certs="/ca")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h?ssl_ca_certs=/ca", "needs TLS"),
        ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "needs ssl_cert_reqs=required"),
        ("rediss://h?ssl_keyfile=/k", "needs ssl_certfile"),
        ("redis://h?ssl_ca_cert=/ca", "unknown option 'ssl_ca_cert'"),
        ("redis://h?socket_timeout=1", "unknown option"),
        ("redis+sentinel://h:1", "needs the service name"),
        ("redis+sentinel://h:1/a/b/c", "/service_name[/db]"),
        ("redis+cluster://h:1/2", "only has database 0"),
        ("redis://h/-1", "0 or more"),
        ("memcached://h", "scheme must be"),
        ("unix:///tmp/r.sock?ssl_ca_certs=/x", "do not apply"),
    ],
)
def test_bad_urls_name_the_problem(url, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_redis_url(url)


def test_redacted_and_described_without_the_password():
    for url in (
        f"redis://app:{SECRET}@h:1/0",
        f"rediss+cluster://app:{SECRET}@a:1,b:2",
        f"redis+sentinel://app:{SECRET}@a:1/m/2?sentinel_password={SECRET}",
    ):
        t = parse_redis_url(url)
        assert SECRET not in t.redacted()
        assert SECRET not in repr(t.describe())
        assert SECRET not in repr(t)  # dataclass reprs hide it too
    assert parse_redis_url(f"redis+sentinel://:{SECRET}@a:1/m/2").redacted() == "redis+sentinel://***@a:1/m/2"


def test_password_file_replaces_the_data_password(tmp_path: Path):
    f = tmp_path / "pw"
    f.write_text(SECRET + "\n")
    s = load_settings(redis_url="redis+sentinel://app@a:1/m", redis_password_file=f)
    t = s.redis_target(s.redis_url)
    assert (t.endpoint.username, t.endpoint.password) == ("app", SECRET)
    s2 = load_settings(redis_url="redis://app@h:1/0", redis_password_file=f)
    assert s2.redis_target(s2.redis_url).endpoint.password == SECRET


def test_password_in_two_places_or_empty_is_a_startup_error(tmp_path: Path):
    f = tmp_path / "pw"
    f.write_text(SECRET)
    s = load_settings(redis_url=f"redis://:{SECRET}@h:1/0", redis_password_file=f)
    with pytest.raises(SettingsError, match="RATE_LIMIT_REDIS_PASSWORD_FILE: the URL already has a password") as e:
        s.redis_target(s.redis_url)
    assert SECRET not in str(e.value)
    (tmp_path / "empty").write_text("\n")
    s = load_settings(redis_url="redis://h:1/0", redis_password_file=tmp_path / "empty")
    with pytest.raises(SettingsError, match="is empty"):
        s.redis_target(s.redis_url)
    with pytest.raises(SettingsError, match="RATE_LIMIT_REDIS_PASSWORD_FILE: file .* does not exist"):
        load_settings(redis_password_file=tmp_path / "missing")


def test_tls_settings_complete_the_url(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    s = load_settings(redis_url="rediss://h:1/0", redis_tls_ca_certs=ca, redis_tls_cert_reqs="required")
    assert s.redis_target(s.redis_url).endpoint.tls == TlsConfig(ca_certs=str(ca))
    s = load_settings(redis_url="rediss+cluster://a:1", redis_tls_cert_reqs="none")
    t = s.redis_target(s.redis_url)
    assert all(e.tls == TlsConfig(cert_reqs="none", check_hostname=False) for e in (t.endpoint, *t.seeds))
    plain = load_settings(redis_url="redis://h:1/0", redis_tls_ca_certs=ca)
    with pytest.raises(SettingsError, match="RATE_LIMIT_REDIS_TLS_CA_CERTS: TLS settings need a rediss:// URL"):
        plain.redis_target(plain.redis_url)
    both = load_settings(redis_url="rediss://h:1/0?ssl_ca_certs=/other.pem", redis_tls_ca_certs=ca)
    with pytest.raises(SettingsError, match="the URL's ssl_ca_certs says otherwise"):
        both.redis_target(both.redis_url)


def test_a_bad_url_setting_never_echoes_the_password():
    with pytest.raises(SettingsError) as e:
        load_settings(redis_url=f"redis://app:{SECRET}@h:1/0?bogus=1")
    assert "RATE_LIMIT_REDIS_URL" in str(e.value) and "unknown option 'bogus'" in str(e.value)
    assert SECRET not in str(e.value)
