// Java's socket classes, blocking (Socket, ServerSocket) and NIO (a non-blocking connect with a
// selector): the output must not depend on where the sockets' stack is.
import java.io.*; import java.net.*; import java.nio.*; import java.nio.channels.*;
public class SocketEcho {
  public static void main(String[] a) throws Exception {
    ServerSocket ss = new ServerSocket(0, 50, InetAddress.getByName("127.0.0.1"));
    int port = ss.getLocalPort();
    Thread t = new Thread(() -> { try (Socket c = ss.accept()) { BufferedReader r = new BufferedReader(new InputStreamReader(c.getInputStream())); PrintWriter w = new PrintWriter(c.getOutputStream(), true); w.println("echo " + r.readLine()); } catch (Exception e) { e.printStackTrace(); } });
    t.start();
    try (Socket s = new Socket()) { s.connect(new InetSocketAddress("127.0.0.1", port), 5000); s.setTcpNoDelay(true);
      new PrintWriter(s.getOutputStream(), true).println("hello java"); System.out.println(new BufferedReader(new InputStreamReader(s.getInputStream())).readLine() + " nodelay=" + s.getTcpNoDelay()); }
    t.join();
    // NIO: a non-blocking connect with a selector
    ServerSocketChannel ssc = ServerSocketChannel.open(); ssc.bind(new InetSocketAddress("127.0.0.1", 0));
    SocketChannel sc = SocketChannel.open(); sc.configureBlocking(false);
    boolean now = sc.connect(ssc.getLocalAddress()); Selector sel = Selector.open(); sc.register(sel, SelectionKey.OP_CONNECT);
    SocketChannel acc = ssc.accept(); sel.select(5000); boolean fin = sc.finishConnect();
    sc.write(ByteBuffer.wrap("nio bytes".getBytes())); ByteBuffer b = ByteBuffer.allocate(64); acc.read(b);
    System.out.println("nio: finished=" + fin + " got=" + new String(b.array(), 0, b.position()));
  }
}
