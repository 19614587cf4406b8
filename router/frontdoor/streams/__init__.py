"""The streams the router holds open to its clients: a call's (`call_streams`), kept as it is
written (`stream_log`) and resumed on any replica (`resumed_streams`), and a handshake session's
standalone stream (`standalone`)."""
