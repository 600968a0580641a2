"""Facts read from RabbitMQ 3.10.8, shared by the unit and integration tests that check
leveret says the same."""

#: Queue arguments RabbitMQ refuses with 406 PRECONDITION_FAILED, and its reply texts
#: (without the ``PRECONDITION_FAILED - `` prefix), for queue 'q' in vhost '/'.
INVALID_QUEUE_ARGUMENTS = [
    ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-message-ttl": "100"}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "
                               '"expected integer, got longstr"'),
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
    ({"x-expires": -5}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_negative,-5}"),
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-max-length": True}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': "
                             '"expected integer, got bool"'),
    ({"x-max-length-bytes": "x"}, "invalid arg 'x-max-length-bytes' for queue 'q' in vhost '/': "
                                  '"expected integer, got longstr"'),
    ({"x-overflow": "nope"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"),
    ({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' "
                                    "in queue 'q' in vhost '/'"),
    ({"x-dead-letter-routing-key": "k"}, "invalid arg 'x-dead-letter-routing-key' for queue 'q' in "
                                         "vhost '/': routing_key_but_no_dlx_defined"),
]
