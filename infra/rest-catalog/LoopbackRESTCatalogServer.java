package org.apache.iceberg.rest;

import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

/**
 * Iceberg's RESTCatalogServer (iceberg-open-api test fixtures) on one address: its own main
 * binds every interface. In its package, for its package-private adapter.
 *
 * <p>java -cp JARS:CLASSES org.apache.iceberg.rest.LoopbackRESTCatalogServer HOST PORT
 * [key=value...], the properties of the catalog behind it (default: a JDBC catalog).
 */
public class LoopbackRESTCatalogServer {
  public static void main(String[] args) throws Exception {
    Map<String, String> props = new HashMap<>();
    for (int i = 2; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      props.put(kv[0], kv[1]);
    }
    props.putIfAbsent("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    props.putIfAbsent("jdbc.schema-version", "V1");
    Catalog catalog = CatalogUtil.buildIcebergCatalog("rest_backend", props, new Configuration());
    RESTCatalogServer.CatalogContext context = new RESTCatalogServer.CatalogContext(catalog, props);
    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(
        new ServletHolder(new RESTCatalogServlet(new RESTServerCatalogAdapter(context))), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(args[0]);
    connector.setPort(Integer.parseInt(args[1]));
    server.addConnector(connector);
    server.setHandler(handler);
    server.start();
    System.out.println("listening on " + args[0] + ":" + args[1]);
    server.join();
  }
}
