"""Who a request comes from: bearer JWTs verified locally, or nobody authenticated.

`JwtAuthenticator` checks a token's signature (HS256 with a shared secret, or RS*, PS* and ES* with
the public keys of a JSON Web Key Set), its `exp`, `nbf` and `iat` (with a small leeway for clock
skew), its `iss` and its `aud`. The registered claims must have the types RFC 7519 gives them
(`exp`, `nbf`, `iat` numbers; `iss`, `sub` strings; `aud` a string or a list of strings): pyjwt
would read `"exp": "9999999999"` as a number, and an infinite one as a crash. The principal is the
token's (issuer, subject). A request without a token, or with a bad one, is refused with HTTP 401
and a `WWW-Authenticate` challenge as RFC 6750 §3 describes. The messages are fixed strings: pyjwt's
own can quote parts of a token.

`AnonymousAuthenticator` authenticates nobody. A bearer token, unverified, still travels with the
request for passthrough backends, which judge it; it also makes the caller the `TOKEN_HOLDER`
pseudo-principal rather than the anonymous one, so that a session opened without a token and a
request carrying one (or the reverse) never meet: the request gets 404.

The two implement the `Authenticator` protocol of router/caller.py.

Library code takes key material as arguments; `configured_authenticator` builds the one
`router.auth` names from what an entry point read (the environment, the JWKS file).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jwt
from starlette.datastructures import Headers

from router.caller import Authenticator, Identity
from router.errors import AuthConfigError, Unauthenticated
from toolsearch.sections.router_settings import RouterAuth
from toolsearch.sessions import Principal

logger = logging.getLogger(__name__)


def bearer_token(headers: Headers) -> str | None:
    """The token of an `Authorization: Bearer` header, if the request has one."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


REALM = "toolsearch"
# Callers of an anonymous router that send a token: not a person, only "whoever holds some token".
# An empty issuer keeps it apart from every verified principal (jwt mode always has an issuer).
TOKEN_HOLDER = Principal(subject="unverified-bearer")
MIN_HS256_SECRET_BYTES = 32  # RFC 7518 §3.2: an HS256 key is at least as long as the hash
_REQUIRED_CLAIMS = ["exp", "iss", "sub", "aud"]
_EC_ALGORITHM = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
MISSING_TOKEN = "this server requires Authorization: Bearer <token>"


class _UnknownKey(jwt.InvalidTokenError):
    """Raised when a token names a signing key (`kid`) the key set does not hold."""


class _WrongClaimType(jwt.InvalidTokenError):
    """Raised when a registered claim has a type RFC 7519 does not allow; the message says which."""


_NUMERIC_CLAIMS = ("exp", "nbf", "iat")  # NumericDate: a JSON number of seconds
_STRING_CLAIMS = ("iss", "sub")


def claim_type_problem(claims: Mapping[str, Any]) -> str | None:
    """What is wrong with the types of a token's registered claims; None when they are right."""
    for name in _NUMERIC_CLAIMS:
        if name not in claims:
            continue
        value = claims[name]
        number = isinstance(value, int) and not isinstance(value, bool)
        if not (number or (isinstance(value, float) and math.isfinite(value))):
            return f"the token's {name} claim must be a number of seconds (NumericDate)"
    for name in _STRING_CLAIMS:
        if name in claims and not isinstance(claims[name], str):
            return f"the token's {name} claim must be a string"
    audience = claims.get("aud")
    if "aud" in claims and not (
        isinstance(audience, str)
        or (isinstance(audience, list) and all(isinstance(a, str) for a in audience))
    ):
        return "the token's aud claim must be a string or a list of strings"
    return None


# Most specific first: the first class a pyjwt error is an instance of gives the description.
_PROBLEMS: tuple[tuple[type[jwt.InvalidTokenError], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet"),
    (jwt.InvalidIssuedAtError, "the token's iat is not valid"),
    (jwt.InvalidAudienceError, "the token is not meant for this server (aud)"),
    (jwt.InvalidIssuerError, "the token comes from another issuer (iss)"),
    (jwt.MissingRequiredClaimError, "the token lacks a required claim (exp, iss, sub, aud)"),
    (jwt.InvalidAlgorithmError, "the token is signed with an algorithm this server does not accept"),
    (_UnknownKey, "the token's signing key (kid) is not known"),
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.DecodeError, "the token is not a well-formed JWT"),
)


def challenge(error: str | None = None, description: str | None = None) -> str:
    """A `WWW-Authenticate` value; a request without credentials gets no error code (RFC 6750 §3.1)."""
    value = f'Bearer realm="{REALM}"'
    if error is not None:
        value += f', error="{error}"'
    if description is not None:
        value += f', error_description="{description}"'
    return value


class AnonymousAuthenticator:
    """Nobody is authenticated; a bearer token, unverified, is kept for passthrough backends."""

    async def authenticate(self, headers: Headers) -> Identity:
        token = bearer_token(headers)
        return Identity(TOKEN_HOLDER if token else Principal(), token)


def _algorithms_of(entry: Mapping[str, Any], algorithms: Sequence[str]) -> list[str]:
    """The accepted algorithms one JWK may verify: its own `alg`, or those its key type fits."""
    if alg := entry.get("alg"):
        return [alg] if alg in algorithms else []
    if entry.get("kty") == "RSA":
        return [a for a in algorithms if a.startswith(("RS", "PS"))]
    if entry.get("kty") == "EC":
        return [a for a in algorithms if a == _EC_ALGORITHM.get(entry.get("crv", ""))]
    return []


def public_keys(jwks: Mapping[str, Any], algorithms: Sequence[str]) -> list[jwt.PyJWK]:
    """The signing keys of a JWKS, one per (key, accepted algorithm); raises `AuthConfigError`."""
    entries = jwks.get("keys")
    if not isinstance(entries, list) or not entries:
        raise AuthConfigError("the JWKS must be a JSON object with a non-empty 'keys' list")
    keys: list[jwt.PyJWK] = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise AuthConfigError(f"JWKS key {number} is not a JSON object")
        if entry.get("use", "sig") != "sig":
            continue  # an encryption key never verifies a signature
        if entry.get("kty") == "oct":
            raise AuthConfigError(f"JWKS key {number} is a shared secret: give it through hs256_secret_env")
        if "d" in entry:
            raise AuthConfigError(f"JWKS key {number} holds private key material: give public keys only")
        for algorithm in _algorithms_of(entry, algorithms):
            try:
                keys.append(jwt.PyJWK(entry, algorithm))
            except jwt.PyJWTError as exc:
                raise AuthConfigError(f"JWKS key {number} cannot verify {algorithm} ({exc})") from None
    if not keys:
        wanted = ", ".join(a for a in algorithms if a != "HS256")
        raise AuthConfigError(f"the JWKS has no public key for {wanted}")
    return keys


class JwtAuthenticator:
    """Verifies bearer JWTs locally; the principal is the token's (issuer, subject)."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        algorithms: Sequence[str],
        hs256_secret: str | None = None,
        jwks: Mapping[str, Any] | None = None,
        leeway: float = 30.0,
    ) -> None:
        if not issuer or not audience or not algorithms:
            raise AuthConfigError("a JWT authenticator needs an issuer, an audience and algorithms")
        if "HS256" in algorithms:
            if not hs256_secret:
                raise AuthConfigError("HS256 needs the shared secret")
            if len(hs256_secret.encode()) < MIN_HS256_SECRET_BYTES:
                raise AuthConfigError(f"the HS256 secret must be at least {MIN_HS256_SECRET_BYTES} bytes")
        asymmetric = [a for a in algorithms if a != "HS256"]
        if asymmetric and jwks is None:
            raise AuthConfigError(f"{', '.join(asymmetric)} need the public keys of a JWKS")
        self._issuer = issuer
        self._audience = audience
        self._algorithms = frozenset(algorithms)
        self._secret = hs256_secret
        self._keys = public_keys(jwks, asymmetric) if asymmetric and jwks is not None else []
        self._leeway = leeway

    async def authenticate(self, headers: Headers) -> Identity:
        token = bearer_token(headers)
        if token is None:
            raise Unauthenticated(MISSING_TOKEN, challenge())
        principal, claims = self.verified(token)
        return Identity(principal, token, claims)

    def verify(self, token: str) -> Principal:
        """The principal of a valid token; raises `Unauthenticated` saying what is wrong with it."""
        return self.verified(token)[0]

    def verified(self, token: str) -> tuple[Principal, dict[str, Any]]:
        """The principal of a valid token and its claims; raises `Unauthenticated` as `verify` does."""
        try:
            claims = self._claims(token)
        except _WrongClaimType as exc:
            problem = str(exc)  # one of claim_type_problem's fixed strings
            logger.debug("refused a bearer token: %s", problem)
            raise Unauthenticated(f"invalid token: {problem}", challenge("invalid_token", problem)) from None
        except jwt.InvalidTokenError as exc:
            problem = next(
                (text for kind, text in _PROBLEMS if isinstance(exc, kind)), "the token is not valid"
            )
            logger.debug("refused a bearer token: %s", problem)
            raise Unauthenticated(f"invalid token: {problem}", challenge("invalid_token", problem)) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            problem = "the token's subject (sub) is empty"
            raise Unauthenticated(f"invalid token: {problem}", challenge("invalid_token", problem))
        return Principal(issuer=self._issuer, subject=subject), claims

    def _claims(self, token: str) -> dict[str, Any]:
        header = jwt.get_unverified_header(token)
        algorithm = header.get("alg")
        if algorithm not in self._algorithms:
            raise jwt.InvalidAlgorithmError(algorithm)
        # Types first, on the unverified claims: pyjwt coerces some and crashes on others. Refusing a
        # forged token for its types rather than its signature refuses it all the same.
        problem = claim_type_problem(jwt.decode(token, options={"verify_signature": False}))
        if problem is not None:
            raise _WrongClaimType(problem)
        keys: list[Any] = [self._secret] if algorithm == "HS256" else self._keys_for(algorithm, header)
        failure: jwt.InvalidTokenError = _UnknownKey()
        for key in keys:
            try:
                return jwt.decode(
                    token,
                    key,
                    algorithms=[algorithm],
                    audience=self._audience,
                    issuer=self._issuer,
                    leeway=self._leeway,
                    options={"require": _REQUIRED_CLAIMS},
                )
            except jwt.InvalidSignatureError as exc:
                failure = exc  # a key set may hold several keys without ids: try the next
        raise failure

    def _keys_for(self, algorithm: str, header: Mapping[str, Any]) -> list[jwt.PyJWK]:
        kid = header.get("kid")
        return [
            key
            for key in self._keys
            if key.algorithm_name == algorithm and (kid is None or key.key_id == kid)
        ]


def authenticator_for(
    settings: RouterAuth, hs256_secret: str | None = None, jwks: Mapping[str, Any] | None = None
) -> Authenticator:
    """The authenticator `settings` describe, with the key material the entry point read."""
    if settings.mode == "anonymous":
        return AnonymousAuthenticator()
    return JwtAuthenticator(
        issuer=settings.issuer or "",
        audience=settings.audience or "",
        algorithms=settings.effective_algorithms(),
        hs256_secret=hs256_secret,
        jwks=jwks,
        leeway=settings.leeway,
    )


def configured_authenticator(settings: RouterAuth, environ: Mapping[str, str]) -> Authenticator:
    """The authenticator of `router.auth`, its key material read from `environ` and the JWKS file."""
    if settings.mode == "anonymous":
        return AnonymousAuthenticator()
    secret = None
    if settings.hs256_secret_env:
        secret = environ.get(settings.hs256_secret_env)
        if not secret:
            name = settings.hs256_secret_env
            raise AuthConfigError(f"router.auth.hs256_secret_env: the environment variable {name} is not set")
    jwks = None
    if settings.jwks_file is not None:
        try:
            jwks = json.loads(settings.jwks_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise AuthConfigError(
                f"router.auth.jwks_file: cannot read {settings.jwks_file} ({exc.strerror})"
            ) from None
        except ValueError:
            raise AuthConfigError(f"router.auth.jwks_file: {settings.jwks_file} is not JSON") from None
        if not isinstance(jwks, dict):
            raise AuthConfigError(f"router.auth.jwks_file: {settings.jwks_file} is not a JSON Web Key Set")
    return authenticator_for(settings, secret, jwks)
