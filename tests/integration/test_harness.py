"""The test harness itself, where a race in it would fail other tests at
random."""
from conftest import start_stub, stop_stub
from helpers import free_port


def test_free_port_is_never_one_a_starting_stub_may_still_take(tmp_path):
    # A stub starts with port 0 and reports its port later (it starts while
    # the other fixtures are set up). A port free_port hands out meanwhile
    # is free only until the stub binds: the kernel may give the stub that
    # very port, and the proxy meant to listen there then cannot (seen:
    # "cannot listen on 127.0.0.1:36003 (in use?)", and the test's request
    # answered by the stub). So free_port waits for the stub's own bind.
    s = start_stub(tmp_path)
    try:
        port = free_port()
        assert not callable(s._port), \
            "free_port handed out a port before the starting stub had bound its own"
        assert port != s.port
    finally:
        stop_stub(s)
