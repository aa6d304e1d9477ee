"""RabbitMQ: the claims pipeline as onceq's second transport.

| module       | holds                                                               |
| url          | EAI_AMQP_URL, the vhost, logging that never shows a password, and   |
|              | the ONE place aiormq/aio-pika exceptions become onceq.errors        |
| topology     | the exchanges, queues and bindings, declared idempotently           |
| publisher    | claim files → persistent, confirmed, mandatory messages             |
| transport    | the consume loop's Transport over aio-pika (qos, robust reconnect)  |
| handler      | decoding a delivery and POSTing it to the claim system (HTTP → Kind)|
| consume      | one consumer run: ledger, deadline, signals, grace                  |
| depths       | queue depths over the network (passive declares; a cache for metrics)|
| management   | the management HTTP API: unacked, memory; optional, never an error  |
| status       | what `mq status` reports: depths, the memory watermark, the API     |

Heavy imports (aiormq, aio_pika, aiohttp) happen inside functions.
"""
