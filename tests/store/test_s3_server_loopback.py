"""The S3 server the tests start accepts connections on the loopback address only."""

from sockets import listening_sockets


def test_the_test_s3_server_listens_on_loopback_only(s3_server):
    sockets = listening_sockets(s3_server.process.pid)
    assert any(socket.port == s3_server.port for socket in sockets)
    assert [str(socket) for socket in sockets if not socket.loopback_only] == []
