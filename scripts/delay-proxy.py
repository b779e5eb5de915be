#!/usr/bin/env python3
"""A TCP proxy that hands every reply back late: listens on 127.0.0.1:LISTEN, forwards
to 127.0.0.1:TARGET, and delays each chunk the server sends by DELAY_MS (in order), so
a Redis behind it answers every command that much later. For scripts/bench.sh
--slow-store.

Usage: scripts/delay-proxy.py LISTEN TARGET DELAY_MS
"""
import asyncio
import sys


async def pipe(reader, writer, delay):
    """Copies reader to writer; each chunk leaves `delay` seconds after it came."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await queue.put((loop.time() + delay, data))
    finally:
        await queue.put((0, None))
        await sender


async def main():
    listen, target, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1e3

    async def serve(creader, cwriter):
        sreader, swriter = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(creader, swriter, 0.0), pipe(sreader, cwriter, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main())
