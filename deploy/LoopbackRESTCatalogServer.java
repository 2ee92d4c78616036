// Iceberg's REST catalog test server (org.apache.iceberg.rest.RESTCatalogServer from iceberg-open-api's test
// fixtures, what the apache/iceberg-rest-fixture image runs), listening on one address only: RESTCatalogServer binds
// every interface and has no setting for it. This builds the same backend catalog and adapter (its own code:
// initializeBackendCatalog reads the image's CATALOG_* environment variables, RESTServerCatalogAdapter serves it;
// both package-private, hence reflection) and serves them as RESTCatalogServer.start does, on a connector bound
// to the address given.
//
// Run with Java's source launcher, the jars of deploy/iceberg-rest-pom.xml on the class path:
//   java -cp 'JARS/*' deploy/LoopbackRESTCatalogServer.java HOST PORT

import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class LoopbackRESTCatalogServer {
  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      throw new IllegalArgumentException("usage: LoopbackRESTCatalogServer HOST PORT");
    }
    Class<?> fixture = Class.forName("org.apache.iceberg.rest.RESTCatalogServer");
    Constructor<?> newFixture = fixture.getDeclaredConstructor();
    newFixture.setAccessible(true);
    Method initialize = fixture.getDeclaredMethod("initializeBackendCatalog");
    initialize.setAccessible(true);
    Object catalogContext = initialize.invoke(newFixture.newInstance());

    Class<?> adapterClass = Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter");
    Constructor<?> newAdapter = adapterClass.getDeclaredConstructor(catalogContext.getClass());
    newAdapter.setAccessible(true);
    RESTCatalogAdapter adapter = (RESTCatalogAdapter) newAdapter.newInstance(catalogContext);

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(args[0]);
    connector.setPort(Integer.parseInt(args[1]));
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    server.join();
  }
}
