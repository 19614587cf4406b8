"""Caller authentication (router/frontdoor/auth.py): real tokens signed with HS256, RS256 and ES256 keys.

The RSA and EC keys are generated here and published to the authenticator as a JSON Web Key Set
file, the way `toolsearch router` reads one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.errors import AuthConfigError, Unauthenticated
from router.frontdoor.auth import (
    TOKEN_HOLDER,
    AnonymousAuthenticator,
    JwtAuthenticator,
    configured_authenticator,
)
from router.frontdoor.resource_metadata import ResourceMetadata
from router.frontdoor.session_layer import SessionLayer
from toolsearch.config import ConfigError, parse_config
from toolsearch.sections.router_settings import RouterAuth
from toolsearch.sessions import Principal

ISSUER = "https://issuer.test"
AUDIENCE = "toolsearch"
SECRET = "an-hs256-secret-of-at-least-thirty-two-bytes"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def claims(**changes: Any) -> dict[str, Any]:
    # A day of life: parametrized tokens are built at collection, and the suite can take many
    # minutes to reach them; only the tests about expiry choose `exp` themselves.
    now = int(time.time())
    base: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 86400}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def hs256(secret: str = SECRET, **changes: Any) -> str:
    return jwt.encode(claims(**changes), secret, algorithm="HS256")


def rs256(key: Any = RSA_KEY, kid: str = "rsa-1", **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm="RS256", headers={"kid": kid})


def es256(**changes: Any) -> str:
    return jwt.encode(claims(**changes), EC_KEY, algorithm="ES256", headers={"kid": "ec-1"})


def jwks() -> dict[str, Any]:
    rsa_jwk = RSAAlgorithm.to_jwk(RSA_KEY.public_key(), as_dict=True)
    ec_jwk = ECAlgorithm.to_jwk(EC_KEY.public_key(), as_dict=True)
    return {"keys": [{**rsa_jwk, "kid": "rsa-1", "use": "sig"}, {**ec_jwk, "kid": "ec-1"}]}


def authenticator(leeway: float = 30.0) -> JwtAuthenticator:
    return JwtAuthenticator(
        issuer=ISSUER,
        audience=AUDIENCE,
        algorithms=["HS256", "RS256", "ES256"],
        hs256_secret=SECRET,
        jwks=jwks(),
        leeway=leeway,
    )


def bearer(token: str) -> Headers:
    return Headers({"authorization": f"Bearer {token}"})


async def refused(token: str | None, auth: JwtAuthenticator | None = None) -> Unauthenticated:
    headers = bearer(token) if token is not None else Headers({})
    with pytest.raises(Unauthenticated) as info:
        await (auth or authenticator()).authenticate(headers)
    return info.value


@pytest.mark.parametrize("sign", [hs256, rs256, es256], ids=["HS256", "RS256", "ES256"])
async def test_a_valid_token_names_its_issuer_and_subject_and_travels_on(sign: Any) -> None:
    token = sign()
    identity = await authenticator().authenticate(bearer(token))
    assert identity.principal == Principal(issuer=ISSUER, subject="alice")
    assert identity.bearer_token == token
    assert token not in repr(identity)


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        (hs256(exp=int(time.time()) - 120), "the token has expired"),
        (hs256(iss="https://elsewhere.test"), "the token comes from another issuer (iss)"),
        (hs256(aud="another-service"), "the token is not meant for this server (aud)"),
        (hs256(secret="another-secret-that-is-also-32-bytes-long"), "the token's signature does not verify"),
        (rs256(key=rsa.generate_private_key(65537, 2048)), "the token's signature does not verify"),
        (rs256(kid="rotated-away"), "the token's signing key (kid) is not known"),
        (hs256(sub=None), "the token lacks a required claim (exp, iss, sub, aud)"),
        (hs256(exp=None), "the token lacks a required claim (exp, iss, sub, aud)"),
        (hs256(nbf=int(time.time()) + 43_200), "the token is not valid yet"),
        (jwt.encode(claims(), None, algorithm="none"), "the token is signed with an algorithm"),
        ("not.a.jwt", "the token is not a well-formed JWT"),
    ],
    ids=[
        "expired",
        "wrong-iss",
        "wrong-aud",
        "bad-hs256-signature",
        "bad-rs256-signature",
        "unknown-kid",
        "no-sub",
        "no-exp",
        "not-yet-valid",
        "alg-none",
        "malformed",
    ],
)
async def test_a_bad_token_is_refused_with_an_rfc_6750_challenge(token: str, problem: str) -> None:
    error = await refused(token)
    assert problem in str(error)
    assert error.www_authenticate.startswith('Bearer realm="toolsearch", error="invalid_token", ')
    assert f'error_description="{problem}' in error.www_authenticate
    assert token not in str(error) and token not in error.www_authenticate


async def test_a_missing_token_gets_a_challenge_without_an_error_code() -> None:
    error = await refused(None)
    assert error.www_authenticate == 'Bearer realm="toolsearch"'
    assert "Authorization: Bearer" in str(error)
    basic = Headers({"authorization": "Basic YWxpY2U6c2VjcmV0"})
    with pytest.raises(Unauthenticated):
        await authenticator().authenticate(basic)


async def test_the_leeway_tolerates_a_little_clock_skew_and_no_more() -> None:
    just_expired = hs256(exp=int(time.time()) - 10)
    assert (await authenticator(leeway=30).authenticate(bearer(just_expired))).principal.subject == "alice"
    await refused(just_expired, authenticator(leeway=0))


async def test_an_hs256_token_is_refused_where_only_public_keys_verify() -> None:
    only_rsa = JwtAuthenticator(issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256"], jwks=jwks())
    assert "algorithm" in str(await refused(hs256(), only_rsa))
    assert (await only_rsa.authenticate(bearer(rs256()))).principal.subject == "alice"


async def test_an_anonymous_router_keeps_a_token_for_passthrough_but_names_no_one() -> None:
    anonymous = AnonymousAuthenticator()
    assert (await anonymous.authenticate(Headers({}))).principal == Principal()
    holder = await anonymous.authenticate(bearer("opaque-token"))
    assert holder.principal == TOKEN_HOLDER != Principal()
    assert holder.principal.issuer == "" and holder.bearer_token == "opaque-token"


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"keys": []}, "non-empty 'keys' list"),
        ({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}, "shared secret"),
        ({"keys": [{**RSAAlgorithm.to_jwk(RSA_KEY, as_dict=True)}]}, "private key material"),
        (
            {"keys": [{**ECAlgorithm.to_jwk(EC_KEY.public_key(), as_dict=True), "use": "enc"}]},
            "no public key",
        ),
    ],
    ids=["empty", "symmetric", "private", "encryption-only"],
)
def test_a_key_set_that_cannot_verify_stops_the_router(keys: dict[str, Any], problem: str) -> None:
    with pytest.raises(AuthConfigError, match=problem):
        JwtAuthenticator(issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256", "ES256"], jwks=keys)


def test_a_short_hs256_secret_is_refused() -> None:
    with pytest.raises(AuthConfigError, match="at least 32 bytes"):
        JwtAuthenticator(issuer=ISSUER, audience=AUDIENCE, algorithms=["HS256"], hs256_secret="short")


def test_the_entry_point_reads_the_secret_from_the_environment_and_the_keys_from_a_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "keys.json").write_text(json.dumps(jwks()))
    raw = {
        "mode": "jwt",
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "hs256_secret_env": "ROUTER_SECRET",
        "jwks_file": "keys.json",
        "algorithms": ["HS256", "ES256"],
    }
    settings = parse_config({"router": {"auth": raw}}, tmp_path / "toolsearch.yaml").router.auth
    assert settings.jwks_file == tmp_path / "keys.json"
    made = configured_authenticator(settings, {"ROUTER_SECRET": SECRET})
    assert isinstance(made, JwtAuthenticator)
    assert made.verify(es256()) == made.verify(hs256()) == Principal(ISSUER, "alice")
    with pytest.raises(AuthConfigError, match="ROUTER_SECRET is not set"):
        configured_authenticator(settings, {})
    (tmp_path / "keys.json").write_text("{not json")
    with pytest.raises(AuthConfigError, match="is not JSON"):
        configured_authenticator(settings, {"ROUTER_SECRET": SECRET})
    assert isinstance(configured_authenticator(RouterAuth(), {}), AnonymousAuthenticator)


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        ({"issuer": ISSUER, "jwks_file": "k.json"}, "for mode jwt only"),
        ({"mode": "jwt", "audience": AUDIENCE, "jwks_file": "k.json"}, "needs issuer and audience"),
        ({"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE}, "needs hs256_secret_env"),
        (
            {
                "mode": "jwt",
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "jwks_file": "k",
                "algorithms": ["HS256"],
            },
            "HS256",
        ),
        ({"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "leeway": 3600, "jwks_file": "k"}, "leeway"),
        ({"authorization_servers": [ISSUER]}, "for mode jwt only"),
        (
            {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_file": "k", "resource": "mcp"},
            "must be an http:// or https:// URL",
        ),
    ],
    ids=[
        "keys-without-jwt-mode",
        "no-issuer",
        "no-keys",
        "hs256-without-secret",
        "huge-leeway",
        "metadata-without-jwt-mode",
        "resource-not-a-url",
    ],
)
def test_auth_settings_that_would_not_verify_are_refused_at_load(auth: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config({"router": {"auth": auth}}, Path("toolsearch.yaml"))


async def test_the_session_layer_answers_401_with_the_challenge_before_anything_else() -> None:
    async def unreachable(scope: Scope, receive: Receive, send: Send) -> None:
        await Response("the request got through")(scope, receive, send)

    # No indexer: a refused request must never get as far as asking one.
    layer = SessionLayer(unreachable, indexer=None, authenticator=authenticator(), max_body_bytes=4096)  # type: ignore[arg-type]
    body = {"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(layer), base_url="http://router.test"
    ) as http:
        expired = hs256(exp=int(time.time()) - 120)
        response = await http.post("/mcp", json=body, headers={"Authorization": f"Bearer {expired}"})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == (
            'Bearer realm="toolsearch", error="invalid_token", error_description="the token has expired"'
        )
        assert response.json()["error"]["message"] == "invalid token: the token has expired"
        missing = await http.post("/mcp", json=body)
        assert (
            missing.status_code == 401 and missing.headers["www-authenticate"] == 'Bearer realm="toolsearch"'
        )


def unchecked_hs256(**changes: Any) -> str:
    """An HS256 token of claims pyjwt would refuse to encode (a number as `iss`, say)."""

    def part(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signed = part(b'{"alg":"HS256","typ":"JWT"}') + b"." + part(json.dumps(claims(**changes)).encode())
    return (signed + b"." + part(hmac.new(SECRET.encode(), signed, hashlib.sha256).digest())).decode()


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"exp": "9999999999"}, "the token's exp claim must be a number of seconds (NumericDate)"),
        ({"exp": float("inf")}, "the token's exp claim must be a number of seconds (NumericDate)"),
        ({"exp": True}, "the token's exp claim must be a number of seconds (NumericDate)"),
        ({"nbf": "0"}, "the token's nbf claim must be a number of seconds (NumericDate)"),
        ({"iat": {"s": 1}}, "the token's iat claim must be a number of seconds (NumericDate)"),
        ({"iss": 7}, "the token's iss claim must be a string"),
        ({"sub": ["alice"]}, "the token's sub claim must be a string"),
        ({"aud": 7}, "the token's aud claim must be a string or a list of strings"),
        ({"aud": [AUDIENCE, None]}, "the token's aud claim must be a string or a list of strings"),
    ],
    ids=[
        "exp-string",
        "exp-infinite",
        "exp-bool",
        "nbf-string",
        "iat-object",
        "iss",
        "sub",
        "aud",
        "aud-list",
    ],
)
async def test_registered_claims_of_the_wrong_type_are_refused(changes: dict[str, Any], problem: str) -> None:
    error = await refused(unchecked_hs256(**changes))
    assert str(error) == f"invalid token: {problem}"
    assert f'error_description="{problem}"' in error.www_authenticate


async def test_numbers_of_either_json_kind_are_dates() -> None:
    later = time.time() + 300
    identity = await authenticator().authenticate(bearer(unchecked_hs256(exp=later, iat=int(later) - 600)))
    assert identity.principal.subject == "alice"


async def test_a_401_of_a_jwt_router_points_at_its_resource_metadata() -> None:
    async def unreachable(scope: Scope, receive: Receive, send: Send) -> None:
        await Response("the request got through")(scope, receive, send)

    settings = RouterAuth(
        mode="jwt", issuer=ISSUER, audience=AUDIENCE, hs256_secret_env="S", scopes=["tools"]
    )
    layer = SessionLayer(unreachable, None, authenticator(), 4096, ResourceMetadata(settings))  # type: ignore[arg-type]
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(layer), base_url="http://router.test"
    ) as http:
        missing = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize"})
    pointer = 'resource_metadata="http://router.test/.well-known/oauth-protected-resource/mcp"'
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == f'Bearer realm="toolsearch", {pointer}'
