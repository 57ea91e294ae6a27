"""Load SSH identity files with messages that say what is wrong and what to do.

paramiko's own errors for keys are opaque ("password must be bytes", KeyError 'mode'); this module
reads the key's header first (OpenSSH's openssh-key-v1 format and PEM) to tell an encrypted key
without a passphrase, and a key encrypted with a cipher paramiko cannot decrypt, apart from a
wrong passphrase or a file that is no key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re

import paramiko

from gpuctl.transport.filememo import FileMemo

_OPENSSH_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----"
_OPENSSH_MAGIC = b"openssh-key-v1\x00"

#: Ciphers paramiko decrypts for Ed25519 keys in OpenSSH's format (its transport ciphers that
#: have a block mode; the GCM ones do not, and fail with KeyError 'mode').
ED25519_KEY_CIPHERS = frozenset(
    name for name, info in getattr(paramiko.Transport, "_cipher_info", {}).items() if "mode" in info
) or frozenset({"aes128-ctr", "aes192-ctr", "aes256-ctr", "aes128-cbc", "aes192-cbc", "aes256-cbc", "3des-cbc"})

#: Ciphers paramiko decrypts for RSA/ECDSA keys in OpenSSH's format (PKey._read_private_key_openssh).
OPENSSH_KEY_CIPHERS = frozenset({"aes256-cbc", "aes256-ctr"})

#: Ciphers paramiko decrypts in traditional PEM keys (DEK-Info header).
PEM_KEY_CIPHERS = frozenset(getattr(paramiko.PKey, "_CIPHER_TABLE", {}).keys()) or frozenset(
    {"AES-128-CBC", "AES-256-CBC", "DES-EDE3-CBC"}
)


class KeyLoadError(Exception):
    """An identity file cannot be used. path: the file. code: "encrypted" (no passphrase given),
    "cipher" (paramiko cannot decrypt it), "passphrase" (wrong one), "missing", "unreadable",
    "format". str(): the message for the admin, naming the file and the way out."""

    def __init__(self, path: str, code: str, message: str):
        self.path = path
        self.code = code
        super().__init__(message)


def _cstring(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 4 > len(data):
        raise ValueError("truncated")
    n = int.from_bytes(data[pos : pos + 4], "big")
    if pos + 4 + n > len(data):
        raise ValueError("truncated")
    return data[pos + 4 : pos + 4 + n], pos + 4 + n


def openssh_key_header(text: str) -> tuple[str, str, bytes] | None:
    """(cipher name, key type, public key blob) of an openssh-key-v1 private key, else None.

    The header is not encrypted, so this works without the passphrase. None when `text` is not in
    that format or is malformed.
    """
    if _OPENSSH_BEGIN not in text:
        return None
    body = text.split(_OPENSSH_BEGIN, 1)[1].split("-----END", 1)[0]
    try:
        data = base64.b64decode("".join(body.split()), validate=True)
        if not data.startswith(_OPENSSH_MAGIC):
            return None
        pos = len(_OPENSSH_MAGIC)
        cipher, pos = _cstring(data, pos)
        _kdf, pos = _cstring(data, pos)
        _kdf_options, pos = _cstring(data, pos)
        pos += 4  # number of keys
        public_blob, pos = _cstring(data, pos)
        key_type, _ = _cstring(public_blob, 0)
    except (ValueError, binascii.Error):
        return None
    return cipher.decode("ascii", "replace"), key_type.decode("ascii", "replace"), public_blob


def public_blob(path: str) -> bytes | None:
    """The public key blob of identity `path`, read from ``path.pub`` or the private key's header.

    Used to pick the agent's key matching an identity file (IdentitiesOnly) without decrypting the
    file. None when neither says.
    """
    try:
        with open(path + ".pub", encoding="ascii", errors="replace") as f:
            fields = f.read().split()
        if len(fields) >= 2:
            return base64.b64decode(fields[1], validate=True)
    except (OSError, ValueError, binascii.Error):
        pass
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            header = openssh_key_header(f.read())
    except OSError:
        return None
    return header[2] if header else None


def _cipher_error(path: str, cipher: str) -> KeyLoadError:
    return KeyLoadError(
        path,
        "cipher",
        f"key {path} uses a cipher this client cannot read: use the agent or re-encrypt it "
        f"(cipher {cipher}; e.g. `ssh-keygen -p -Z aes256-ctr -f {path}`)",
    )


def _encrypted_error(path: str) -> KeyLoadError:
    return KeyLoadError(path, "encrypted", f"key {path} is encrypted: give a passphrase or use the agent")


def load_private_key(path: str, passphrase: str | None = None) -> paramiko.PKey:
    """The private key in file `path` (RSA, ECDSA, Ed25519; OpenSSH or PEM format).

    A key read without a passphrase is read once per process while the file is unchanged
    (gpuctl.transport.filememo); errors are not remembered. passphrase: for an encrypted key (str). Raises KeyLoadError: "key K is encrypted: give a
    passphrase or use the agent" (encrypted, no passphrase); "key K uses a cipher this client cannot
    read: use the agent or re-encrypt it (...)" (e.g. aes256-gcm@openssh.com); "key K: wrong
    passphrase"; "key K does not exist"; "key K cannot be read: REASON"; "key K is not a private
    key this client can read: DETAIL".
    """
    if passphrase:
        return _load_private_key(path, passphrase)  # a decrypted key is not kept past its use
    return _LOADED.get(path, lambda: (_load_private_key(path, None), (path,)))


def _load_private_key(path: str, passphrase: str | None) -> paramiko.PKey:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise KeyLoadError(path, "missing", f"key {path} does not exist") from None
    except OSError as exc:
        raise KeyLoadError(path, "unreadable", f"key {path} cannot be read: {exc.strerror}") from exc
    text = raw.decode("ascii", "replace")
    encrypted = False
    header = openssh_key_header(text)
    if header is not None:
        cipher, key_type, _ = header
        if cipher != "none":
            encrypted = True
            readable = ED25519_KEY_CIPHERS if key_type == "ssh-ed25519" else OPENSSH_KEY_CIPHERS
            if cipher not in readable:
                raise _cipher_error(path, cipher)
    elif "BEGIN ENCRYPTED PRIVATE KEY" in text:
        encrypted = True
    elif "Proc-Type: 4,ENCRYPTED" in text:
        encrypted = True
        m = re.search(r"DEK-Info:\s*([A-Za-z0-9-]+)", text)
        if m and m.group(1).upper() not in PEM_KEY_CIPHERS:
            raise _cipher_error(path, m.group(1))
    if encrypted and not passphrase:
        raise _encrypted_error(path)
    password = passphrase.encode() if (encrypted and passphrase) else None
    try:
        return paramiko.PKey.from_path(path, password)
    except paramiko.PasswordRequiredException:
        raise _encrypted_error(path) from None
    except (paramiko.SSHException, ValueError, TypeError, KeyError, IndexError) as exc:
        if encrypted:
            raise KeyLoadError(path, "passphrase", f"key {path}: wrong passphrase (could not decrypt it)") from exc
        raise KeyLoadError(
            path, "format", f"key {path} is not a private key this client can read: {exc}"
        ) from exc


#: Unencrypted private keys loaded by this process, by path (load_private_key).
_LOADED: FileMemo[paramiko.PKey] = FileMemo()
