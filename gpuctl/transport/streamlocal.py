"""Open an OpenSSH ``direct-streamlocal@openssh.com`` channel with paramiko: a channel that the
node's sshd joins to a Unix socket on the node (what ``ssh -L local:/remote.sock`` uses).

paramiko has no API for it (paramiko#544, open since 2015): ``Transport.open_channel`` writes the
destination only for tcpip and x11 kinds, and sshd drops a connection whose channel-open message
lacks the socket path. :func:`open_streamlocal` sends the message itself, laid out as in OpenSSH's
PROTOCOL file, section 2.4::

    byte      SSH_MSG_CHANNEL_OPEN
    string    "direct-streamlocal@openssh.com"
    uint32    sender channel
    uint32    initial window size
    uint32    maximum packet size
    string    socket path
    string    reserved ("")
    uint32    reserved (0)

and registers the channel the way ``Transport.open_channel`` does (paramiko 3.x to 5.x; pinned by
tests/integration/test_streamlocal.py against a real sshd). sshd connects to the socket from the user's own
session process, so the daemon's SO_PEERCRED sees the SSH login user, as with the bridge. sshd
refuses it when ``AllowStreamLocalForwarding`` is no (or ``DisableForwarding`` yes, or the key's
``restrict`` / ``no-port-forwarding``): :class:`paramiko.ChannelException` with code 1
(administratively prohibited); code 2 (connect failed) when nothing listens at the path.
"""

from __future__ import annotations

import threading
import time

import paramiko
from paramiko.common import cMSG_CHANNEL_OPEN
from paramiko.message import Message

#: The channel type, as OpenSSH names it.
KIND = "direct-streamlocal@openssh.com"


def open_streamlocal(transport: paramiko.Transport, socket_path: str, timeout_s: float) -> paramiko.Channel:
    """A channel joined by the server to the Unix socket `socket_path` on the server's host.

    timeout_s: seconds to wait for the server's answer. Raises paramiko.ChannelException (the
    server refused: .code 1 prohibited, 2 connect failed; .text its reason), paramiko.SSHException
    (session not active, no answer within timeout_s, or the connection died meanwhile).
    """
    if not transport.active:
        raise paramiko.SSHException("SSH session not active")
    with transport.lock:
        window_size = transport._sanitize_window_size(None)
        max_packet_size = transport._sanitize_packet_size(None)
        chanid = transport._next_channel()
        m = Message()
        m.add_byte(cMSG_CHANNEL_OPEN)
        m.add_string(KIND)
        m.add_int(chanid)
        m.add_int(window_size)
        m.add_int(max_packet_size)
        m.add_string(socket_path)
        m.add_string("")
        m.add_int(0)
        chan = paramiko.Channel(chanid)
        transport._channels.put(chanid, chan)
        transport.channel_events[chanid] = event = threading.Event()
        transport.channels_seen[chanid] = True
        chan._set_transport(transport)
        chan._set_window(window_size, max_packet_size)
    transport._send_user_message(m)
    deadline = time.monotonic() + timeout_s
    while not event.wait(0.05):
        if not transport.active:
            raise transport.get_exception() or paramiko.SSHException("connection lost opening the channel")
        if time.monotonic() >= deadline:
            transport._channels.delete(chanid)
            raise paramiko.SSHException(f"no answer to the {KIND} channel open within {timeout_s:g} s")
    opened = transport._channels.get(chanid)
    if opened is not None:
        return opened
    raise transport.get_exception() or paramiko.SSHException("the server refused the channel")
