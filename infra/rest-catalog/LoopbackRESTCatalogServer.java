package org.apache.iceberg.rest;

import jakarta.servlet.ServletConfig;
import jakarta.servlet.ServletException;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
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
 * [key=value...], the properties of the catalog behind it (default: a JDBC catalog), and
 * `require-bearer=TOKEN`: every request but a token request must carry `Authorization: Bearer
 * TOKEN` (the adapter's OAuth2 endpoint gives `client-credentials-token:sub=CLIENT_ID` for the
 * client credentials grant), else 401.
 */
public class LoopbackRESTCatalogServer {
  public static void main(String[] args) throws Exception {
    Map<String, String> props = new HashMap<>();
    for (int i = 2; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      props.put(kv[0], kv[1]);
    }
    String bearer = props.remove("require-bearer");
    props.putIfAbsent("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    props.putIfAbsent("jdbc.schema-version", "V1");
    Catalog catalog = CatalogUtil.buildIcebergCatalog("rest_backend", props, new Configuration());
    RESTCatalogServer.CatalogContext context = new RESTCatalogServer.CatalogContext(catalog, props);
    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    HttpServlet rest = new RESTCatalogServlet(new RESTServerCatalogAdapter(context));
    handler.addServlet(new ServletHolder(bearer == null ? rest : requiring(bearer, rest)), "/*");
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

  private static HttpServlet requiring(String bearer, HttpServlet rest) {
    return new HttpServlet() {
      @Override
      public void init(ServletConfig config) throws ServletException {
        super.init(config);
        rest.init(config);
      }

      @Override
      protected void service(HttpServletRequest request, HttpServletResponse response)
          throws ServletException, IOException {
        boolean tokens = request.getRequestURI().endsWith("/v1/oauth/tokens");
        if (!tokens && !("Bearer " + bearer).equals(request.getHeader("Authorization"))) {
          response.setStatus(401);
          response.setContentType("application/json");
          response
              .getWriter()
              .write(
                  "{\"error\":{\"message\":\"Not authorized\","
                      + "\"type\":\"NotAuthorizedException\",\"code\":401}}");
          return;
        }
        rest.service(request, response);
      }
    };
  }
}
